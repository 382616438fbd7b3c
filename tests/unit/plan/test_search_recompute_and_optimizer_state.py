"""``dlmspec plan --search`` with the optimizer-state options and the selective recompute sets: a
model whose fp32 optimizer state fits on no layout is placed with the first state option that fits,
named in the candidate and its ``--set`` lines; the selective sets that fit are each timed and
ranked by tokens/s, and the search table shows which modules each recomputes."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from dlmspec.plan.report import print_search
from dlmspec.plan.search import TIE_TOLERANCE, search
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec
from spec_kit import spec_dict


def _qwen3(preset: str, gbs: int, seq: int, gpu: str = "h100", gpus: int = 1) -> Spec:
    return Spec.model_validate(spec_dict({
        "model": {"preset": preset, "vocab_size": 151936, "max_position_embeddings": seq,
                  "transformer_impl": "local"},
        "objective.mask_token_id": 151669,
        "train.micro_batch_size": 1, "train.global_batch_size": gbs, "train.seq_length": seq,
        "data.tokenizer.vocab_size": 151667, "cluster.gpu": gpu, "cluster.gpus_per_node": gpus,
    }))


def test_model_whose_fp32_optimizer_state_fits_nowhere_gets_a_named_state_option():
    # Qwen3-8B on one H100: 8.2e9 x 18 bytes of weights, gradients and fp32 state cannot fit, nor
    # 12 with bf16 moments; with the state in host memory 6 bytes per parameter stay.
    result = search(resolve(_qwen3("qwen3-8b", gbs=8, seq=2048)), top=3)
    assert result.top, result.message
    best = result.top[0]
    assert "cpu-offload" in best.label
    assert {"--set train.use_precision_aware_optimizer=true", "--set train.optimizer_cpu_offload=true"} <= set(
        best.set_args())
    assert best.to_dict()["optimizer_state"] == "cpu-offload"
    assert best.peak_bytes <= result.capacity_bytes


def test_spec_own_optimizer_state_is_kept_where_it_fits():
    result = search(resolve(_qwen3("qwen3-0.6b", gbs=8, seq=2048)), top=5)
    assert result.top and all(c.to_dict()["optimizer_state"] == "spec" for c in result.top)


def test_selective_recompute_sets_that_fit_are_ranked_by_tokens_per_second():
    # Qwen3-1.7B at 4k on one H100: micro batch 8 fits only with recomputation; every selective set
    # that fits is timed, and among them the faster comes first.
    result = search(resolve(_qwen3("qwen3-1.7b", gbs=8, seq=4096)), top=200, validate=False)
    selective = [c for c in result.top if c.layout.recompute == "selective" and c.layout.micro_batch == 8
                 and not c.tight]
    modules = {tuple(c.layout.recompute_modules) for c in selective}
    assert len(modules) >= 2, modules  # more than the default core_attn alone
    speeds = [c.tokens_per_second for c in selective]
    # fastest first, except that a layout may follow a tie (within TIE_TOLERANCE) it beats
    assert all(b <= a / (1 - TIE_TOLERANCE) for a, b in zip(speeds, speeds[1:]))
    assert speeds[0] == max(speeds)


def test_search_table_names_the_recomputed_modules_and_the_optimizer_state():
    result = search(resolve(_qwen3("qwen3-8b", gbs=8, seq=2048)), top=5)
    out = StringIO()
    print_search(result, 5, Console(file=out, width=250))
    text = out.getvalue()
    assert "opt. state" in text and "cpu-offload" in text
    selective = [c for c in result.top if c.layout.recompute == "selective"]
    for c in selective:
        assert f"selective ({'+'.join(c.layout.recompute_modules)})" in text
        if tuple(c.layout.recompute_modules) != ("core_attn",):
            assert "--set recompute.modules=[" in " ".join(c.set_args())
