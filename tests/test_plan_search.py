"""``dlmspec plan --search``: enumerated layouts obey the rules, a 70B model finds a layout on
64 H100s, an impossible case finds none and says why."""

from __future__ import annotations

from dlmspec.plan import make_plan
from dlmspec.plan.search import enumerate_layouts, plan_candidate, search
from dlmspec.plan.shape import layout, model_shape
from dlmspec.resolve import resolve
from dlmspec.spec import Spec
from dlmspec.validate import find_issues


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
    assert speeds == sorted(speeds, reverse=True)
    for cand in result.top:
        assert cand.peak_bytes <= resolved.gpu.memory_bytes
        new = spec.replace(**cand.spec_changes())
        new_resolved = resolve(new)
        errors = [i for i in find_issues(new, new_resolved) if i.severity == "error"]
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
