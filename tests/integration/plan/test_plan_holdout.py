"""bench/plan/holdout.py: predictions of the configurations kept out of the calibration, and the
comparison with measurements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_scripts import load_script

ROOT = Path(__file__).resolve().parents[3]


def _holdout():
    return load_script("bench/plan/holdout.py", "plan_holdout")


def test_holdout_entries_are_not_calibration_configurations():
    holdout = {e["name"] for e in json.loads((ROOT / "bench/plan/holdout.json").read_text())}
    matrix = {e["name"] for e in json.loads((ROOT / "bench/plan/matrix.json").read_text())}
    assert holdout and not holdout & matrix


def test_predict_then_compare(tmp_path):
    h = _holdout()
    pred = tmp_path / "predictions.json"
    h.predict(pred)
    preds = json.loads(pred.read_text())["predictions"]
    assert [p["name"] for p in preds] == [e["name"] for e in json.loads(h.HOLDOUT.read_text())]
    first = preds[0]
    measured = tmp_path / "m.json"
    measured.write_text(json.dumps({"runs": [
        {"name": first["name"], "step_seconds": first["planned_step_seconds"] * 1.25,
         "peak_allocated_bytes": first["planned_peak_allocated_bytes"]},
        {"name": preds[1]["name"], "error": "not run"}]}))
    out = tmp_path / "out.json"
    assert h.compare(pred, measured, out) == 1  # 1/1.25 - 1 = -20%: a miss
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["time_error"] == pytest.approx(-0.2) and rows[0]["memory_error"] == pytest.approx(0.0)
    assert rows[1] == {"name": preds[1]["name"], "error": "not run"}


def test_committed_predictions_match_the_committed_measurements():
    """The holdout result file compares each measurement with the prediction committed before it."""
    preds = {p["name"]: p for p in json.loads((ROOT / "bench/results/holdout_predictions.json").read_text())["predictions"]}
    result = json.loads((ROOT / "bench/results/planner_holdout_h200x2.json").read_text())
    measured = {r["name"]: r for r in result["runs"]}
    for row in result["comparison"]:
        p, m = preds[row["name"]], measured[row["name"]]
        assert row["predicted_step_seconds"] == p["planned_step_seconds"]
        assert row["time_error"] == pytest.approx(p["planned_step_seconds"] / m["step_seconds"] - 1)
        assert row["memory_error"] == pytest.approx(p["planned_peak_allocated_bytes"] / m["peak_allocated_bytes"] - 1)
