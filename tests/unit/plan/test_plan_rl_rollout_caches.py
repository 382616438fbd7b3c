"""The planner's rollout time with the sampler's block KV caches (dlmspec/plan/rl.py,
``sampler_schedule``): a refresh call runs the whole sequence, a cached call runs the block and
the masked suffix (``"prefix"``) or the block alone (``"dual"``) against every key, ``cache_refresh``
sets the refreshes per block, and the kernel launches count once per call."""

from __future__ import annotations

import pytest

from rl_plan_kit import EAGER, rl_plan, rollout_work


def plan(*extra: str):
    """The demo's RL plan with the eager rollout forward (CUDA-graph rollouts: test_plan_rl_rollout_cuda_graphs.py)."""
    return rl_plan(EAGER, *extra)


def _parts(p) -> tuple[float, float]:
    b, lay = p.time.breakdown, p.layout
    microbatches = lay.global_batch // (lay.micro_batch * lay.dp)
    return (b["gemm"] + b["attention"] + b["elementwise"]) / 3, b["kernel_launch"] / (3 * microbatches)


@pytest.mark.parametrize("cache, refresh, equivalents, columns", [
    # one refresh per block, 15 cached calls over 512 - (384 + 32 b) columns: 128, 96, 64, 32
    ("prefix", None, 4 + 15 * (128 + 96 + 64 + 32) / 512, 80.0),
    ("dual", None, 4 + 15 * 4 * 32 / 512, 32.0),
    # a refresh every 4 steps: 4 per block, 12 cached calls
    ("prefix", 4, 16 + 12 * (128 + 96 + 64 + 32) / 512, 80.0),
    # a refresh every step: no cached call, the no-cache cost
    ("dual", 1, 64.0, 0.0),
])
def test_cached_rollouts_cost_the_columns_they_run(cache, refresh, equivalents, columns) -> None:
    extra = [f'generate.cache="{cache}"'] + ([f"generate.cache_refresh={refresh}"] if refresh else [])
    p = plan(*extra)
    assert p.layout.seq == 512
    assert p.rl.sampler_passes == pytest.approx(equivalents)
    assert p.rl.sampler_calls == 64 and p.rl.cache == cache and p.rl.attended_keys == 512
    assert p.rl.cached_query_columns == pytest.approx(columns)
    _, launches = _parts(p)
    work = rollout_work(p)
    # the decoder's work scales with the columns a call runs; the output layer and the logits' traffic
    # are the block's columns in every call, cached or not
    none = plan()
    none_work = rollout_work(none)
    assert work["decoder"] == pytest.approx(none_work["decoder"] * equivalents / 64)
    assert work["head"] == pytest.approx(none_work["head"])
    assert p.time.breakdown["rl_rollout"] == pytest.approx(work["decoder"] + work["head"] + work["logits"] + 64 * launches)


def test_a_cache_makes_the_planned_rollout_cheaper_than_none_and_dual_cheaper_than_prefix() -> None:
    none, prefix, dual = (plan(f'generate.cache="{c}"') for c in ("none", "prefix", "dual"))
    assert none.rl.sampler_passes == 64 and none.rl.cache == "none"
    assert dual.time.breakdown["rl_rollout"] < prefix.time.breakdown["rl_rollout"] < none.time.breakdown["rl_rollout"]
    from dlmspec.plan.rl import rl_lines

    assert "cached calls run 32 of 512 columns" in "\n".join(rl_lines(dual.rl))
