"""bench/plan/public_points.py on the MoE points: the held-out errors pinned at the committed
result in both directions, the one point over the target named, and the recipes' MoE settings
(token dispatcher, TP overlap, parameter-gather overlap) reaching the plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "bench" / "results" / "plan" / "public_points.json"

from bench.plan import public_points as pp  # noqa: E402

#: A held-out point's error may move this much (absolute, either way) from the committed result:
#: the benchmark is deterministic, so a move is a change of the planner or the data, which then
#: commits a new result.
PIN = 0.005
#: The held-out points over the target (none over 25%) in the committed result, with why: the
#: plan of the B200 Qwen3-235B point is host-launch-bound at the public hosts' fitted launch time,
#: and the host work of megatron-core's combined 1F1B schedule (the recipe's moe_a2a_overlap, which
#: a later Megatron-Bridge recipe turned off for its CPU overhead) is not counted
#: (docs/planner-methods.md, "MoE layers at cluster scale").
OVER_TARGET = {"bridge-25.11-b200-qwen3-235b-a22b-mxfp8-64gpu"}


@pytest.fixture(scope="module")
def predictions():
    return {x.point.name: x for x in pp.predict()}


def test_held_out_errors_stay_at_their_committed_values(predictions):
    committed = {p["name"]: p["error"] for p in json.loads(RESULT.read_text())["points"] if p["held_out"]}
    for name, error in committed.items():
        got = predictions[name].error
        assert got == pytest.approx(error, abs=PIN), (name, got, error)


def test_only_the_named_point_is_over_the_target(predictions):
    over = {n for n, x in predictions.items() if x.held_out and abs(x.error) > pp.TARGET_MAX}
    assert over == OVER_TARGET


def test_the_h100_qwen3_235b_points_are_within_the_target_after_the_moe_terms(predictions):
    for name in ("bridge-25.11-h100-qwen3-235b-a22b-fp8cs-256gpu-gbs2048",
                 "bridge-26.04.01-h100-qwen3-235b-a22b-fp8-256gpu-gbs8192"):
        assert abs(predictions[name].error) <= pp.TARGET_MAX, (name, predictions[name].error)


def test_every_expert_parallel_point_states_its_dispatcher_and_the_plan_takes_it():
    for p in pp.read_points():
        if p.use != "used" or not p.moe or p.config.get("ep", 1) <= 1:
            continue
        kind = p.config.get("moe_token_dispatcher_type")
        assert kind in ("alltoall", "flex"), p.name
        assert any("token dispatch by" in a for a in p.assumptions), p.name
        lay = pp._make_plan(p).layout
        if kind == "flex":
            assert p.config["moe_flex_dispatcher_backend"] in ("deepep", "hybridep"), p.name
            assert lay.moe_flex_dispatcher == p.config["moe_flex_dispatcher_backend"], p.name
        else:
            assert lay.moe_flex_dispatcher == "", p.name


def test_the_recipes_without_tp_overlap_or_overlapped_parameter_gather_are_planned_so():
    points = {p.name: p for p in pp.read_points()}
    for name in ("bridge-25.11-h100-qwen3-235b-a22b-fp8cs-256gpu-gbs2048",
                 "bridge-26.04.01-h100-qwen3-235b-a22b-fp8-256gpu-gbs8192"):
        assert not pp._make_plan(points[name]).layout.tp_comm_overlap, name
    b200 = pp._make_plan(points["bridge-25.11-b200-qwen3-235b-a22b-mxfp8-64gpu"])
    assert not b200.layout.overlap_param_gather


def test_a_flex_point_without_its_backend_is_a_data_error(tmp_path):
    import shutil

    data = tmp_path / "public"
    shutil.copytree(pp.DATA, data)
    path = data / "megatron-bridge-performance-summary.json"
    doc = json.loads(path.read_text())
    for p in doc["points"]:
        if p["config"].get("moe_token_dispatcher_type") == "flex":
            del p["config"]["moe_flex_dispatcher_backend"]
            break
    path.write_text(json.dumps(doc))
    with pytest.raises(pp.PublicDataError, match="moe_flex_dispatcher_backend"):
        pp.read_points(data)
