"""A plan names the public measurements its multi-GPU constants come from, the nearest ones and
how far it extrapolates from them (dlmspec.plan.provenance.public_info)."""

from __future__ import annotations

import tomli_w
from spec_kit import spec_dict as make_spec

from dlmspec.plan import make_plan
from dlmspec.plan.calibration import PUBLIC_MEASURED, PUBLIC_POINTS
from dlmspec.resolve import resolve
from dlmspec.spec.load import load_text


def _plan(**changes):
    data = make_spec(changes)
    return make_plan(resolve(load_text(tomli_w.dumps(data), name="t.toml").spec))


def test_te_plan_names_its_nearest_public_points_and_how_far():
    plan = _plan(**{"model.transformer_impl": "transformer_engine", "cluster.nodes": 32,
                    "parallel.tensor_model_parallel_size": 8, "train.global_batch_size": 256})
    pub = plan.to_dict()["provenance"]["public_points"]
    assert pub["fitted_from"].startswith("bench/calibration/public")
    assert len(pub["nearest"]) == 2 and all(n["name"] in {p["name"] for p in PUBLIC_POINTS} for n in pub["nearest"])
    assert "the GPUs (256 vs" in pub["nearest"][0]["how_far"]
    keys = {e["key"] for e in pub["outside"]}
    assert "cluster (GPUs)" in keys and 256 > PUBLIC_MEASURED.world_size[1]
    assert "parallel.tensor_model_parallel_size" in keys  # TP 8 beyond the points' TP 4
    assert pub["text"].startswith("multi-GPU constants fitted on")


def test_plan_inside_the_points_ranges_lists_nothing_outside_them():
    plan = _plan(**{"model.transformer_impl": "transformer_engine", "parallel.tensor_model_parallel_size": 2})
    pub = plan.to_dict()["provenance"]["public_points"]
    assert pub["outside"] == []


def test_local_path_plan_has_no_public_points():
    plan = _plan(**{"model.transformer_impl": "local"})
    assert plan.to_dict()["provenance"]["public_points"] is None
