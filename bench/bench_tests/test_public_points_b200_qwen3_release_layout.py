"""The 25.11 B200 Qwen3-235B-A22B point is planned on its release recipe's layout: 4 virtual
pipeline stages (Megatron-Bridge tag v0.2.0, scripts/performance/configs/qwen3/workload_base_configs.py
QWEN3_235B_A22B_B200_FP8_CS_BASE_CONFIG, changed from 2 in commit 2f633397c "235b, 405b OOM
resolve"), not the table's 2; on it the plan fits the B200, and with the table's 2 it does not."""

from __future__ import annotations

import json
import shutil

from bench.plan import public_points as pp

NAME = "bridge-25.11-b200-qwen3-235b-a22b-mxfp8-64gpu"
DATA_FILE = "megatron-bridge-performance-summary.json"


def _point(points):
    return next(p for p in points if p.name == NAME)


def test_the_b200_qwen3_235b_point_is_planned_on_the_release_recipes_four_virtual_stages_and_fits():
    p = _point(pp.read_points())
    assert p.config["vpp"] == 4
    assert any("2f633397c3cc303add3ee792ed3771173546c0cd" in a and "v0.2.0" in a for a in p.assumptions)
    assert p.planned_not_to_fit_why is None
    plan = pp._make_plan(p)
    assert plan.layout.vpp == 4
    assert plan.fits, plan.peak_bytes / 2**30
    assert plan.peak_bytes / 2**30 < 178


def test_the_tables_two_virtual_stages_are_planned_not_to_fit_the_b200(tmp_path):
    data = tmp_path / "public"
    shutil.copytree(pp.DATA, data)
    path = data / DATA_FILE
    doc = json.loads(path.read_text())
    raw = next(x for x in doc["points"] if x["name"] == NAME)
    raw["config"]["vpp"] = 2  # the performance table's VP column
    path.write_text(json.dumps(doc))
    plan = pp._make_plan(_point(pp.read_points(data)))
    assert plan.layout.vpp == 2
    assert not plan.fits
    assert plan.peak_bytes / 2**30 > 178
