"""The sampler (backends/generate/sampler.py ``generate``, block_cache.py ``GPTBlockLogits``) gives, for
fixed seeds, exactly what the sampler of commit 9284fc4 gives (tests/kits/sampler_reference_kit.py, its
code verbatim): the same canvas, outputs, forward passes (per row too) and step events, on every
remasking rule, temperature, filter, guidance, EOS skipping, left padding, masking schedule and block
cache; and it does less host work per step (fewer ops, no per-step sync on the fixed-step paths)."""

from __future__ import annotations

import pytest
import torch

import sampler_reference_kit as reference
from block_cache_kit import tiny_gpt
from cpu_world_kit import megatron_cpu_world

V, MASK, EOS, STOP = 32, 31, 30, 1
PROMPTS = [[STOP, 2, 3], [4, 5, 6, 7, 8], [9], [STOP, 10, 11, 12], [13, 14]]


def toy_logits_fn():
    """A bidirectional toy model: each position's logits from its token and the mean of the real
    tokens of its row; a row holding the token ``STOP`` predicts EOS everywhere (so its first block
    comes out all EOS and its later blocks are skipped)."""
    g = torch.Generator().manual_seed(0)
    emb, out = torch.randn(V, 16, generator=g), torch.randn(16, V, generator=g) * 3

    def logits_fn(tokens, attention_mask=None):
        real = torch.ones(tokens.shape, dtype=torch.bool) if attention_mask is None else attention_mask
        h = emb[tokens]
        context = (h * real[..., None]).sum(1, keepdim=True) / real.sum(1, keepdim=True)[..., None]
        logits = (h + context) @ out
        logits[..., EOS] += 100.0 * (tokens == STOP).any(1)[:, None]
        return logits

    return logits_fn


def _run(sample, logits_fn, prompts, config, **kw):
    events = []

    def on_step(e):
        events.append((e.step, e.block, e.prompt_length, e.tokens.clone(), e.committed.clone()))

    out = sample(logits_fn, prompts, config, on_step=on_step, **kw)
    quiet = sample(logits_fn, prompts, config, **kw)  # no callback: the canvas is written back per block
    return out, events, quiet


#: why a logits function without a block path (this test's toy model) runs its forward eager under cuda_graph = true
_NO_GRAPH = ("cuda_graph = true needs a megatron-core GPTModel of the runtime (gpt_logits_fn) on one pipeline stage "
             "without sequence parallelism; this logits function runs eager")
#: why a megatron-core GPTModel on the CPU runs its forward eager under cuda_graph = true
_ON_CPU = "the model is not on a CUDA device (parameters on cpu): CUDA graphs need one; the forward runs eager"


def _assert_same(new, old):
    (out, events, quiet), (ref_out, ref_events, _) = new, old
    assert torch.equal(out.sequences, ref_out.sequences)
    # the reference sampler predates [generate] cuda_graph: it records no reason for running eager
    mine, theirs = out.to_dict(), ref_out.to_dict()
    assert mine.pop("cuda_graph_fallback") in ((_NO_GRAPH, _ON_CPU) if out.config["cuda_graph"] else (None,))
    theirs.pop("cuda_graph_fallback", None)
    assert mine == theirs
    assert out.prompt_length == ref_out.prompt_length
    assert torch.equal(quiet.sequences, out.sequences) and quiet.to_dict() == out.to_dict()
    assert len(events) == len(ref_events)
    for e, r in zip(events, ref_events):
        assert e[:3] == r[:3] and torch.equal(e[3], r[3]) and torch.equal(e[4], r[4])


CASES = [
    dict(),
    dict(remasking="random"),
    dict(remasking="threshold", threshold=0.5),
    dict(remasking="factor", factor=1.0),
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5, top_p=0.9),
    dict(temperature=1.0, remasking="threshold", threshold=0.3),
    dict(cfg_scale=1.5, temperature=1.0),
    dict(steps=6),  # two commits a step
]


@pytest.mark.parametrize("eos", [None, EOS])
@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_sampler_gives_the_reference_samplers_tokens_passes_and_events(kw, eos):
    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.sampler import generate

    settings = dict(gen_length=12, steps=12, block_length=4, mask_token_id=MASK, eos_token_id=eos, seed=3)
    settings.update(kw)
    config = GenerateConfig(**settings)
    fn = toy_logits_fn()
    new, old = _run(generate, fn, PROMPTS, config), _run(reference.generate, fn, PROMPTS, config)
    _assert_same(new, old)
    if eos is not None and kw.get("cfg_scale", 0) == 0:
        # the rows with STOP finish in block 0 and leave the batch: the skipping path ran
        assert new[0].finish_reasons[0] == "eos" and new[0].forward_passes_per_row[0] < new[0].forward_passes


def test_unpadded_tensor_prompts_and_a_cosine_schedule_give_the_reference_tokens():
    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.sampler import generate
    from dlmspec.objectives.schedules import masking_schedule

    config = GenerateConfig(gen_length=16, steps=8, block_length=8, mask_token_id=MASK, temperature=1.0, seed=5)
    prompts = torch.tensor([[4, 5, 6], [7, 8, 9]])
    schedule = masking_schedule("cosine")
    fn = toy_logits_fn()
    one_arg = lambda tokens: fn(tokens)  # noqa: E731  (no padding: called with one argument)
    _assert_same(_run(generate, one_arg, prompts, config, noise_schedule=schedule),
                 _run(reference.generate, one_arg, prompts, config, noise_schedule=schedule))


def test_a_float64_model_output_is_not_written_by_the_sampler():
    from dlmspec.backends.generate.sampler import sample_tokens

    logits = torch.randn(2, 3, V, dtype=torch.float64)
    kept = logits.clone()
    tokens, _ = sample_tokens(logits, temperature=1.0, generator=torch.Generator().manual_seed(0), exclude=MASK)
    assert torch.equal(logits, kept)
    assert not bool((tokens == MASK).any())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        yield {"bidirectional": tiny_gpt("bidirectional", seed=3), "causal": tiny_gpt("causal"),
               "block_causal": tiny_gpt("block_causal", block_size=4, seed=2)}


@pytest.mark.parametrize("which", ["bidirectional", "causal", "block_causal"])
@pytest.mark.parametrize("cache,refresh", [("none", None), ("prefix", None), ("dual", None), ("dual", 2)])
@pytest.mark.parametrize("kw", [dict(), dict(temperature=1.0), dict(remasking="threshold", threshold=0.2)],
                         ids=["low_confidence", "gumbel", "threshold"])
def test_gptmodel_block_caches_give_the_reference_samplers_tokens(models, which, cache, refresh, kw):
    from block_cache_kit import EOS as GPT_EOS, MASK as GPT_MASK

    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    config = GenerateConfig(gen_length=12, steps=12, block_length=4, mask_token_id=GPT_MASK, eos_token_id=GPT_EOS,
                            cache=cache, cache_refresh=refresh, seed=1, **kw)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15], [16, 17, 18, 19, 20]]
    # a fresh logits function per sampler: each builds its own GPTBlockLogits
    new = _run(generate, gpt_logits_fn(models[which]), prompts, config)
    old = _run(reference.generate, gpt_logits_fn(models[which]), prompts, config)
    _assert_same(new, old)
    assert new[0].cache == cache


def _ops_and_syncs(fn, *args, **kw):
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = {"ops": 0, "syncs": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts["ops"] += 1
            if func.overloadpacket.__name__ in ("_local_scalar_dense", "nonzero"):
                counts["syncs"] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        out = fn(*args, **kw)
    return out, counts


def test_the_rollout_path_dispatches_fewer_ops_and_syncs_than_the_reference():
    """The RL rollout's sampling (temperature 1, EOS, left padding, one block of 8): per call fewer
    ops and syncs than the reference; no sync per step (the count does not grow with the steps)."""
    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.sampler import generate

    prompts = [[4 + i % 7] * (1 + i % 5) for i in range(32)]
    fn = toy_logits_fn()

    def config(steps):
        return GenerateConfig(gen_length=8, steps=steps, block_length=8, mask_token_id=MASK, eos_token_id=EOS,
                              temperature=1.0)

    new, new_counts = _ops_and_syncs(generate, fn, prompts, config(8))
    old, old_counts = _ops_and_syncs(reference.generate, fn, prompts, config(8))
    assert torch.equal(new.sequences, old.sequences)
    model_ops = _ops_and_syncs(fn, new.sequences, torch.ones_like(new.sequences, dtype=torch.bool))[1]["ops"]
    sampler_ops = (new_counts["ops"] - 8 * model_ops) / 8
    old_sampler_ops = (old_counts["ops"] - 8 * model_ops) / 8
    assert sampler_ops < 0.75 * old_sampler_ops, (sampler_ops, old_sampler_ops)
    assert new_counts["syncs"] < old_counts["syncs"]
    _, four_steps = _ops_and_syncs(generate, fn, prompts, config(4))
    assert four_steps["syncs"] == new_counts["syncs"]
