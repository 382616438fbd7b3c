"""Every public configuration that ran is planned to fit its GPU, or the data says why not."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "plan"))

import public_points as pp  # noqa: E402


@pytest.fixture(scope="module")
def predictions():
    return pp.predict()


def test_no_used_point_is_planned_not_to_fit_without_a_stated_reason(predictions):
    unexplained = [(x.point.name, round(x.peak_gib, 1)) for x in predictions
                   if x.fits is False and not getattr(x.point, "planned_not_to_fit_why", None)]
    assert not unexplained


def test_a_stated_reason_is_only_kept_while_the_plan_still_says_it_does_not_fit(predictions):
    stale = [x.point.name for x in predictions if x.fits and x.point.planned_not_to_fit_why]
    assert not stale


def test_recipes_fp8_primary_weights_and_bf16_gradients_reach_the_plan():
    points = {p.name: p for p in pp.read_points()}
    p = points["bridge-25.11-h100-llama3-70b-fp8cs-64gpu-gbs128"]
    plan = pp._make_plan(p)
    assert plan.layout.fp8_param_gather and not plan.layout.grad_fp32
    assert plan.fits, plan.peak_bytes / 2**30


def test_uneven_405b_point_plans_its_126_layers():
    points = {p.name: p for p in pp.read_points()}
    p = points["bridge-25.11-h100-llama31-405b-fp8cs-1024gpu-gbs512"]
    spec = pp.point_spec(p)
    assert spec["model"].get("num_layers", 126) == 126
    assert spec["parallel"]["account_for_embedding_in_pipeline_split"] is True
    plan = pp._make_plan(p)
    assert plan.shape.num_layers == 126
    assert plan.fits


def test_reason_that_is_not_a_sentence_is_refused_naming_file_and_key(tmp_path):
    import shutil

    for f in pp.DATA.glob("*.json"):
        shutil.copy(f, tmp_path / f.name)
    path = tmp_path / "nemo-24.07-performance-summary.json"
    doc = json.loads(path.read_text())
    doc["points"][0]["planned_not_to_fit_why"] = 7
    path.write_text(json.dumps(doc))
    with pytest.raises(pp.PublicDataError) as err:
        pp.read_points(tmp_path)
    assert err.value.file.endswith("nemo-24.07-performance-summary.json")
    assert err.value.key == "points[0].planned_not_to_fit_why"
