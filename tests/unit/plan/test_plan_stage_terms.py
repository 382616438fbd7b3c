"""A training stage's own memory and time terms in the plan (dlmspec/plan/memory.py
STAGE_MEMORY_TERMS, dlmspec/plan/time.py STAGE_TIME_TERMS);
the toy stage of tests/integration/runtime/test_toy_stage.py plans one through a spec."""

from __future__ import annotations

import pytest

from dlmspec.plan import memory, time
from dlmspec.plan.memory import StageMemoryTerm, register_stage_memory_term
from dlmspec.plan.time import StageTimeTerm, register_stage_time_term


def test_a_stage_term_may_not_take_a_planner_terms_name() -> None:
    for name in ("weights", "cuda_context"):
        with pytest.raises(ValueError, match="planner's own terms"):
            register_stage_memory_term("toy", StageMemoryTerm(name, "x", lambda s, l, i: 0.0))
    assert "toy" not in memory.STAGE_MEMORY_TERMS
    with pytest.raises(ValueError, match="planner's own terms"):
        register_stage_time_term("toy", StageTimeTerm("gemm", "x", lambda s, l, b: 0.0))
    assert "toy" not in time.STAGE_TIME_TERMS


def test_a_stage_term_registered_twice_is_counted_once() -> None:
    try:
        register_stage_memory_term("toy", StageMemoryTerm("buffer", "first", lambda s, l, i: 1.0))
        register_stage_memory_term("toy", StageMemoryTerm("buffer", "second", lambda s, l, i: 2.0))
        assert [t.label for t in memory.STAGE_MEMORY_TERMS["toy"]] == ["second"]
        assert memory.stage_memory_label("buffer") == "second"
    finally:
        memory.STAGE_MEMORY_TERMS.pop("toy", None)


def test_a_stage_term_reads_its_stage_table_from_the_shape() -> None:
    from pathlib import Path

    from dlmspec.plan import make_plan
    from dlmspec.plan.shape import model_shape
    from dlmspec.resolve import resolve
    from dlmspec.spec.load import load

    spec = Path(__file__).resolve().parents[3] / "specs" / "demo-dlm.toml"
    overrides = ['stage.kind="rl"', "stage.rl.grpo_group_size=4"]
    shapes = [model_shape(resolve(load(spec, overrides, fast=fast).spec)) for fast in (False, True)]
    assert shapes[0].stage_options == shapes[1].stage_options  # the fast path's tables give the same
    assert dict(shapes[0].stage_options)["grpo_group_size"] == 4
    assert model_shape(resolve(load(spec).spec)).stage_options == ()
    registered = memory.STAGE_MEMORY_TERMS.get("rl", ())
    try:
        register_stage_memory_term("rl", StageMemoryTerm(
            "rollout_buffer", "rollouts", lambda s, l, i: 1000.0 * dict(s.stage_options)["grpo_group_size"]))
        plan = make_plan(resolve(load(spec, overrides).spec)).to_dict()["memory"]
        assert plan["breakdown"]["rollout_buffer"] == 4000
    finally:
        memory.STAGE_MEMORY_TERMS["rl"] = registered
