"""Calibration.gpu_compute_scale: a GPU's achieved compute relative to the calibration's GPU."""

from __future__ import annotations

import tomli_w
from spec_kit import spec_dict as make_spec

from dlmspec.plan import DEFAULT_CALIBRATION, make_plan
from dlmspec.plan.calibration import CALIBRATED_PATHS
from dlmspec.plan.time import stage_work
from dlmspec.resolve import resolve
from dlmspec.spec.load import load_text


def _plan(gpu: str):
    data = make_spec({"cluster.gpu": gpu})
    return make_plan(resolve(load_text(tomli_w.dumps(data), name="t.toml").spec), DEFAULT_CALIBRATION)


def test_a_scaled_gpu_takes_longer_for_the_same_gemms_and_attention():
    plan = _plan("h100")
    half = DEFAULT_CALIBRATION.with_values(gpu_compute_scale={"h100": 0.5})
    a = stage_work(plan.shape, plan.layout, plan.gpu, 0, DEFAULT_CALIBRATION)
    b = stage_work(plan.shape, plan.layout, plan.gpu, 0, half)
    assert abs(b.gemm_seconds - 2 * a.gemm_seconds) < 1e-15
    assert abs(b.attention_seconds - 2 * a.attention_seconds) < 1e-15
    assert b.elementwise_seconds == a.elementwise_seconds


def test_a_gpu_not_listed_is_planned_unscaled():
    plan = _plan("h200")
    other = DEFAULT_CALIBRATION.with_values(gpu_compute_scale={"h100": 0.5})
    assert stage_work(plan.shape, plan.layout, plan.gpu, 0, other) == \
        stage_work(plan.shape, plan.layout, plan.gpu, 0, DEFAULT_CALIBRATION)


def test_local_path_has_no_scale_and_the_calibrated_gpu_is_never_scaled():
    assert CALIBRATED_PATHS["local+sdpa"][0].gpu_compute_scale == {}
    te = CALIBRATED_PATHS["transformer_engine"][0].gpu_compute_scale
    assert "h200" not in te and all(0.5 <= v <= 1.3 for v in te.values())
