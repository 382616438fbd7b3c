"""The layout (data-parallel sizes, microbatches, divisibility) is derived once, in
dlmspec.layout, and resolve, the planner's relayout, the layout search, validate's rules and the
runtime's checks agree on it for layouts that divide and layouts that do not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dlmspec import layout
from dlmspec.check import issues_for
from dlmspec.plan.search import enumerate_layouts
from dlmspec.plan.shape import layout as plan_layout
from dlmspec.plan.shape import model_shape, relayout
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from spec_kit import spec_file

ROOT = Path(__file__).resolve().parents[3]

# (gpus, tp, pp, cp, global batch, micro batch): the last ones do not divide.
TABLE = [
    (8, 1, 1, 1, 64, 2),
    (8, 2, 1, 1, 64, 4),
    (8, 2, 2, 1, 32, 1),
    (8, 1, 2, 2, 16, 2),
    (16, 2, 2, 2, 16, 1),
    (8, 1, 1, 1, 12, 1),   # 12 sequences over DP 8: no whole number of microbatches
    (8, 2, 1, 1, 20, 2),   # 20 over micro 2 * DP 4
    (6, 4, 1, 1, 8, 1),    # 6 GPUs do not split into TP 4
    (12, 1, 8, 1, 8, 1),   # nor into PP 8
]


def spec_for(tmp_path: Path, gpus: int, tp: int, pp: int, cp: int, gbs: int, mbs: int):
    """The loaded spec of 8 layers (no grouped queries) on ``gpus`` GPUs of one node with this layout
    and batch (sequence 256, 10 iterations); transformer_engine when context parallel."""
    path = spec_file(tmp_path, {
        "model.num_layers": 8, "model.num_query_groups": 8,
        "model.transformer_impl": "transformer_engine" if cp > 1 else None,
        "train.micro_batch_size": mbs, "train.global_batch_size": gbs, "train.seq_length": 256,
        "train.train_iters": 10, "train.eval_interval": 5, "train.lr_warmup_iters": None,
        "cluster.gpus_per_node": gpus,
    }, parallel={"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                 "context_parallel_size": cp, "sequence_parallel": tp > 1})
    return load(path)


@pytest.mark.parametrize("gpus, tp, pp, cp, gbs, mbs", TABLE)
def test_resolve_plan_search_validate_and_runtime_agree_on_a_layout(tmp_path, gpus, tp, pp, cp, gbs, mbs) -> None:
    divides = layout.world_divides(gpus, tp, pp, cp) and layout.batch_divides(
        gbs, mbs, layout.data_parallel_size(gpus, tp, pp, cp))
    expected = layout.derive(gpus, tp=tp, pp=pp, cp=cp, ep=1, etp=tp, global_batch_size=gbs, micro_batch_size=mbs)

    loaded = spec_for(tmp_path, gpus, tp, pp, cp, gbs, mbs)
    r = resolve(loaded.spec)
    assert (r.dp, r.expert_dp, r.num_microbatches) == tuple(expected)

    # The planner's relayout, starting from a one-GPU-per-rank layout of the same cluster.
    shape, lay = model_shape(r), plan_layout(r)
    _, moved = relayout(shape, lay, tp=1, pp=1, cp=1, micro_batch=1)
    _, back = relayout(shape, moved, tp=tp, pp=pp, cp=cp, micro_batch=mbs)
    assert (back.dp, back.expert_dp, back.num_microbatches) == tuple(expected)
    assert (lay.dp, lay.num_microbatches) == (expected.dp, expected.num_microbatches)

    # The search yields the layout exactly when it divides, with the same sizes.
    found = [cand for cand, _ in enumerate_layouts(shape, lay, allow_cp=True, max_micro_batch=64)
             if (cand.tp, cand.pp, cand.cp, cand.micro_batch, cand.vpp) == (tp, pp, cp, mbs, 1)]
    assert bool(found) == divides
    for cand in found:
        assert (cand.dp, cand.expert_dp, cand.num_microbatches) == tuple(expected)

    # validate's rules report the layouts that do not divide.
    rules = {i.rule for i in issues_for("validate", loaded, r)}
    assert bool({"world-divisible-by-model-parallel", "batch-divisible"} & rules) == (not divides)

    # The runtime's checks refuse them, and count the same microbatches otherwise.
    checks = pytest.importorskip("dlmspec.backends.megatron.checks")
    from dlmspec.backends.megatron.config import ScheduleConfig

    problem = layout.world_problem(gpus, tp, pp, cp)
    if problem is None:
        sched = ScheduleConfig(micro_batch_size=mbs, global_batch_size=gbs)
        if divides:
            assert checks.microbatches_per_step(sched, r.dp) == r.num_microbatches
        else:
            with pytest.raises(ValueError, match="not a multiple of micro_batch_size"):
                checks.microbatches_per_step(sched, r.dp)


#: A data-parallel size or microbatch count computed in place: ``world // (tp * pp * cp)``
#: (three sizes; a divisor search over two is not one), ``global_batch // (micro_batch * dp)``,
#: ``global_batch % (micro_batch * dp)``.
INLINE_DERIVATION = re.compile(
    r"world(?:_size)?\s*(?://|%)\s*\([^)]*\*[^)]*\*|global_batch(?:_size)?\s*(?://|%)\s*\(\s*[\w.]*micro_batch")


def test_the_layout_is_derived_in_one_module() -> None:
    offenders = []
    for folder in ("dlmspec", "backends"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "dlmspec" / "layout.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("#", 1)[0]
                if INLINE_DERIVATION.search(code) and "``" not in code and not code.lstrip().startswith('"'):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == [], "derive DP / microbatches with dlmspec.layout:\n" + "\n".join(offenders)
