"""``dlmspec plan --search``: enumerated layouts obey the rules, a 70B model finds a layout on
64 H100s, an impossible case finds none and says why; a spec whose own layout is invalid is
still searched (its layout errors reported apart), the top pick keeps memory headroom, ties go to
the simpler layout."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from dlmspec.check import find
from dlmspec.spec.load import load
from dlmspec.plan import HEADROOM_WARNING, make_plan
from dlmspec.plan.search import (
    TIE_TOLERANCE,
    Candidate,
    enumerate_layouts,
    plan_candidate,
    rank,
    search,
    simplicity,
    spec_issues_for_search,
)
from dlmspec.plan.shape import layout, model_shape
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec


def _llama70b(gpus_per_node: int, nodes: int, gpu: str = "h100", gbs: int = 128) -> Spec:
    return Spec.model_validate({
        "name": "llama70b",
        "model": {"preset": "llama-3-70b"},
        "objective": {"kind": "ar"},
        "train": {"micro_batch_size": 1, "global_batch_size": gbs, "seq_length": 4096, "train_iters": 100},
        "data": {"mock": True, "tokenizer": {"type": "NullTokenizer", "vocab_size": 128255}},
        "cluster": {"gpu": gpu, "gpus_per_node": gpus_per_node, "nodes": nodes},
    })


def test_llama_70b_on_64_h100_finds_fitting_valid_layouts():
    spec = _llama70b(8, 8)
    resolved = resolve(spec)
    assert not make_plan(resolved).fits  # TP 1 x DP 64 cannot hold 70B
    result = search(resolved, top=3)
    assert result.top, result.message
    assert result.enumerated > result.fitting > 0
    speeds = [c.tokens_per_second for c in result.top]
    # fastest first, except that a layout may follow a tie (within TIE_TOLERANCE) it beats
    assert all(b <= a / (1 - TIE_TOLERANCE) for a, b in zip(speeds, speeds[1:]))
    assert speeds[0] >= max(c.tokens_per_second for c in result.top) * (1 - TIE_TOLERANCE)
    for cand in result.top:
        assert cand.peak_bytes <= resolved.gpu.memory_bytes
        new = spec.replace(**cand.spec_changes())
        new_resolved = resolve(new)
        errors = [i for i in find(("spec",), new, new_resolved) if i.severity == "error"]
        assert errors == []
        full = make_plan(new_resolved, impl=cand.layout.impl)
        assert full.fits
        assert full.peak_bytes == plan_candidate(resolved, cand).peak_bytes
        assert all(arg.startswith("--set ") for arg in cand.set_args())


def test_impossible_case_is_rejected_with_a_message():
    resolved = resolve(_llama70b(1, 1, gpu="l40s", gbs=8))
    result = search(resolved, top=3)
    assert result.top == [] and result.fitting == 0
    assert result.message.startswith("no layout fits")
    assert "GiB" in result.message and result.smallest is not None


def test_enumerated_layouts_satisfy_divisibility():
    resolved = resolve(_llama70b(8, 2, gbs=64))
    shape, base = model_shape(resolved), layout(resolved)
    seen = 0
    for lay, changes in enumerate_layouts(shape, base):
        seen += 1
        assert lay.tp * lay.pp * lay.cp * lay.dp == 16
        assert 64 % (lay.micro_batch * lay.dp) == 0 and lay.num_microbatches * lay.micro_batch * lay.dp == 64
        assert 64 % lay.tp == 0 and 8 % lay.tp == 0 and 80 % lay.pp == 0  # heads, groups, layers
        assert lay.tp <= 8
        if lay.vpp > 1:
            assert (80 // lay.pp) % lay.vpp == 0 and lay.num_microbatches % lay.pp == 0
        assert lay.sp == (lay.tp > 1)
        assert changes["tp"] == lay.tp and changes["micro_batch"] == lay.micro_batch
    assert seen > 1000


ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "specs" / "demo-dlm.toml"


def test_spec_with_an_invalid_layout_is_searched_for_its_model_and_cluster():
    # TP 5 divides neither the demo's 12 heads nor its FFN (2048) nor its 8 GPUs; the FFN rule
    # names model.ffn_hidden_size, a key the search does not set, yet it is the layout's fault.
    loaded = load(DEMO, ["cluster.gpus_per_node=8", "parallel.tensor_model_parallel_size=5",
                         "train.global_batch_size=64"])
    resolved = resolve(loaded.spec)
    issues = find(("spec",), loaded, resolved)
    blocking, own = spec_issues_for_search(loaded, resolved, issues)
    assert blocking == []
    assert {"tp-divides-heads", "tp-divides-ffn"} <= {i.rule for i in own}
    assert any(i.key == "model.ffn_hidden_size" for i in own)
    result = search(resolved, top=3)
    assert result.top, result.message
    for cand in result.top:
        assert cand.layout.tp in (1, 2, 4) and cand.layout.world == 8
        new = loaded.spec.replace(**cand.spec_changes())
        assert [i for i in find(("spec",), new, resolve(new)) if i.severity == "error"] == []


def test_search_still_stops_on_the_specs_own_errors():
    # 5 query groups do not divide 12 heads at any layout: the search cannot fix that.
    loaded = load(DEMO, ["cluster.gpus_per_node=8", "parallel.tensor_model_parallel_size=5",
                         "model.num_query_groups=5", "train.global_batch_size=64"])
    resolved = resolve(loaded.spec)
    blocking, _ = spec_issues_for_search(loaded, resolved, find(("spec",), loaded, resolved))
    assert [(i.rule, i.key) for i in blocking] == [("heads-divisible-by-groups", "model.num_query_groups")]


def _qwen_on_two_a100_40gb() -> Spec:
    return Spec.model_validate({
        "model": {"preset": "qwen3-1.7b"}, "objective": {"kind": "ar"},
        "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096, "train_iters": 10},
        "data": {"mock": True, "tokenizer": {"type": "NullTokenizer", "vocab_size": 151669}},
        "cluster": {"gpu": "a100-40gb", "gpus_per_node": 2},
    })


def test_top_pick_keeps_memory_headroom():
    # Qwen3-1.7B on two 40 GB A100s: the fastest layouts that fit use ~98% of the memory.
    result = search(resolve(_qwen_on_two_a100_40gb()), top=100, validate=False)
    assert result.tight > 0 and result.fitting > result.tight
    fastest = max(result.top, key=lambda c: c.tokens_per_second)
    assert fastest.tight and fastest.memory_fraction > HEADROOM_WARNING
    assert not result.top[0].tight and result.top[0].memory_fraction <= HEADROOM_WARNING
    flags = [c.tight for c in result.top]
    assert flags == sorted(flags)  # every layout with headroom before every tight one
    assert f"more than {HEADROOM_WARNING:.0%} of the memory" in result.message
    assert result.to_dict()["top"][flags.index(True)]["tight"] is True


def test_ties_go_to_the_simpler_layout():
    # Qwen3-1.7B on 8 H100s with TE: DP 8, CP 2 x DP 4 and CP 4 x DP 2 plan the same tokens/s;
    # context parallelism gains nothing, so the plain data-parallel layout comes first.
    spec = Spec.model_validate({
        "model": {"preset": "qwen3-1.7b", "transformer_impl": "transformer_engine"}, "objective": {"kind": "ar"},
        "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 8192, "train_iters": 10},
        "data": {"mock": True, "tokenizer": {"type": "NullTokenizer", "vocab_size": 151669}},
        "cluster": {"gpu": "h100", "gpus_per_node": 8},
    })
    result = search(resolve(spec), top=50, validate=False)
    best = result.top[0]
    tied = [c for c in result.top if abs(c.tokens_per_second - best.tokens_per_second) <= 1e-9 * best.tokens_per_second]
    assert len({c.layout.cp for c in tied}) > 1
    assert best.layout.cp == 1 and best.layout.tp == best.layout.pp == 1
    assert [simplicity(c.layout) for c in tied] == sorted(simplicity(c.layout) for c in tied)


def test_rank_is_deterministic_and_orders_ties_headroom_and_speed():
    base = layout(resolve(_qwen_on_two_a100_40gb()))

    def cand(tps: float, frac: float, **lay) -> Candidate:
        return Candidate(layout=replace(base, **lay), peak_bytes=frac * 40e9, peak_allocated_bytes=0.0,
                         step_seconds=1 / tps, tokens_per_second=tps, mfu=0.0,
                         changes=tuple(sorted(lay.items())), memory_fraction=frac)

    fast_tight = cand(130.0, 0.97, tp=1)
    cp2 = cand(100.0, 0.50, cp=2)
    plain = cand(99.5, 0.60)  # within 1% of cp2: tied, and simpler
    slow = cand(90.0, 0.40, tp=2)
    expected = [plain, cp2, slow, fast_tight]
    for seed in range(5):
        shuffled = expected[:]
        random.Random(seed).shuffle(shuffled)
        assert rank(shuffled) == expected


def test_search_plans_with_the_layer_paths_own_calibration():
    """A Transformer Engine spec is searched with the TE constants (as make_plan plans it), and the
    result names them (``calibration``: the line ``plan --search`` prints, and its JSON)."""
    from dlmspec.plan.calibration import CALIBRATED_PATHS, DEFAULT_CALIBRATION
    from dlmspec.plan.search import plan_candidate

    root = Path(__file__).resolve().parents[3]
    te = resolve(load(root / "bench" / "throughput" / "qwen3-1.7b-mdm.toml",
                      ['model.transformer_impl="transformer_engine"']).spec)
    result = search(te, top=1, validate=False)
    assert result.calibration["status"] == "calibrated" and result.calibration["fitted_on"] == "transformer_engine"
    assert result.to_dict()["calibration"] == result.calibration
    best = result.top[0]
    assert plan_candidate(te, best).calibration == CALIBRATED_PATHS["transformer_engine"][0] != DEFAULT_CALIBRATION
    planned = make_plan(resolve(te.spec.replace(train={"micro_batch_size": best.layout.micro_batch})))
    local = resolve(load(root / "specs" / "demo-dlm.toml").spec)
    assert search(local, top=1, validate=False).calibration["fitted_on"] == "local+sdpa"
    assert planned.calibration == plan_candidate(te, best).calibration
