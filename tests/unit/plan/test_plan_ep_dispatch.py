"""The planner's launches of the alltoall dispatcher at expert-parallel size > 1
(dlmspec.plan.launches.KERNELS_EP_DISPATCH), and calibrate.py's per-configuration comparison."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from bench_scripts import load_script

from dlmspec.spec.load import load
from dlmspec.plan import DEFAULT_CALIBRATION, make_plan
from dlmspec.plan.memory import stage_layer_counts
from dlmspec.plan.launches import KERNELS_EP_DISPATCH, KERNELS_PER_LOCAL_EXPERT, kernels_per_microbatch, kernels_per_step
from dlmspec.resolve import resolve

ROOT = Path(__file__).resolve().parents[3]
MATRIX = {e["name"]: e for e in json.loads((ROOT / "bench" / "plan" / "matrix.json").read_text())}


def _plan(name):
    entry = MATRIX[name]
    return make_plan(resolve(load(ROOT / entry["base"], entry["overrides"]).spec), DEFAULT_CALIBRATION)


def test_ep2_adds_the_dispatchers_launches_per_moe_layer():
    one, ep2 = _plan("demo-moe-e8-top2"), _plan("demo-moe-ep2")
    assert ep2.layout.ep == 2 and one.layout.ep == 1
    k1 = kernels_per_microbatch(one.shape, one.layout, stage_layer_counts(one.shape, one.layout, 0))
    k2 = kernels_per_microbatch(ep2.shape, ep2.layout, stage_layer_counts(ep2.shape, ep2.layout, 0))
    moe_layers = stage_layer_counts(ep2.shape, ep2.layout, 0)[1]
    assert moe_layers == 12
    # Half the local experts, plus the dispatcher's launches on every MoE layer.
    path = "local+sdpa"
    assert k1 - k2 == moe_layers * (KERNELS_PER_LOCAL_EXPERT[path] * 4 - KERNELS_EP_DISPATCH[path])


def test_ep2_measured_launch_difference_is_what_the_constant_encodes():
    """KERNELS_EP_DISPATCH comes from the expert-parallel profiles: the launches per step of the
    one-GPU and the EP2 run differ by what the other counts drop minus what the dispatcher adds."""
    prof = json.loads((ROOT / "bench" / "results" / "profile_host_h200x2.json").read_text())["summaries"]
    one = prof["demo-moe-e8-top2"]["rank0"]["host"]["launches_per_step"]
    ep2 = sum(prof["demo-moe-ep2"][r]["host"]["launches_per_step"] for r in ("rank0", "rank1")) / 2
    p1, p2 = _plan("demo-moe-e8-top2"), _plan("demo-moe-ep2")
    moe_layers = stage_layer_counts(p2.shape, p2.layout, 0)[1]
    dispatch = moe_layers * KERNELS_EP_DISPATCH["local+sdpa"]
    counted_drop = kernels_per_step(p1.shape, p1.layout) - (kernels_per_step(p2.shape, p2.layout) - dispatch)
    assert counted_drop == 13 * 4 * 12 + 5 * (279 - 183)  # local-expert kernels, optimizer per-tensor kernels
    added = counted_drop - (one - ep2)
    assert added / moe_layers == pytest.approx(KERNELS_EP_DISPATCH["local+sdpa"], abs=1)


def test_planned_launches_per_step_against_every_profiled_rank():
    """bench/plan/launch_counts.py: planned / measured - 1 between -9.3% and +16.0% on the
    expert-parallel profiles (docs/planner.md quotes the range)."""
    rows = load_script("bench/plan/launch_counts.py", "plan_launch_counts").compare()
    assert len(rows) == 11
    errors = [r["error"] for r in rows]
    assert min(errors) == pytest.approx(-0.093, abs=5e-4) and max(errors) == pytest.approx(0.160, abs=5e-4)


def _calibrate():
    return load_script("bench/plan/calibrate.py", "plan_calibrate_ep")


def test_by_configuration_medians_and_spread():
    cal = _calibrate()
    runs = [SimpleNamespace(name=n, measured_seconds=m) for n, m in
            [("a", 1.0), ("b", 2.0), ("a", 1.2), ("a", 0.9)]]
    planned = [1.1, 1.5, 1.1, 1.3]
    out = cal.by_configuration(runs, planned)
    assert [c[0] for c in out] == ["a", "b"]
    name, n, med_m, med_p, err, spread = out[0]
    assert (n, med_m, med_p) == (3, 1.0, 1.1)
    assert err == pytest.approx(0.1) and spread == pytest.approx(0.3)
    assert out[1][1:] == (1, 2.0, 1.5, pytest.approx(-0.25), 0.0)
    line = cal._configuration_lines(out, out)[0]
    assert "within 15% 1/2 (misses: `b` -25.0% (1 measurements))" in line
    assert "differ from themselves by 30%" in line


def test_committed_trials_are_what_the_script_computes():
    """bench/results/planner_trials_ep_dispatch_host_factor.json (quoted by docs/planner.md) is what
    bench/plan/planner_trials.py computes on the committed records and constants."""
    trials = load_script("bench/plan/planner_trials.py", "plan_trials_session5")
    committed = json.loads((ROOT / "bench" / "results" / "planner_trials_ep_dispatch_host_factor.json").read_text())
    assert trials.ep_dispatch() == committed["ep_dispatch"]
    assert committed["ep_dispatch"]["0"]["records_within_15"] == "55/70"
    assert committed["ep_dispatch"]["48"]["medians_within_15"] == "28/28"
