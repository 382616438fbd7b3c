"""The fp8 GEMMs of the Transformer Engine path: megatron-core runs the decoder layers' linear
layers in fp8 (TE's fp8 autocast wraps each TransformerLayer) while the output layer (megatron's own
ColumnParallelLinear, or the fused linear cross entropy) stays bf16, and fp8 GEMMs reach their own
fraction of the fp8 peak: ``Calibration.fp8_gemm_efficiency``, a time feature of its own (``gemm_fp8``)
that bench/plan/calibrate.py fits on TE fp8 runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlmspec.gpus import get_gpu
from dlmspec.plan import make_plan
from dlmspec.plan.calibration import CALIBRATED_PATHS, DEFAULT_CALIBRATION
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
ENTRIES = {e["name"]: e for e in json.loads((ROOT / "bench" / "plan" / "te_matrix.json").read_text())}


def _plan(name: str, calib=None):
    e = ENTRIES[name]
    return make_plan(resolve(load(ROOT / e["base"], e["overrides"]).spec), calib)


def test_fp8_plans_the_decoder_gemms_at_the_fp8_peak_and_the_output_layer_at_bf16() -> None:
    bf16, fp8 = _plan("te-bf16-mb8"), _plan("te-fp8-delayed-mb8")
    gpu = get_gpu("h200")
    assert bf16.time.features["gemm_fp8"] == 0.0 and bf16.time.features["gemm"] > 0
    assert fp8.time.features["gemm"] > 0  # the output layer's GEMMs, bf16
    assert fp8.time.features["gemm"] < 0.3 * bf16.time.features["gemm"]
    # the same GEMM FLOPs, the decoder's at the fp8 peak
    total = fp8.time.features["gemm"] + fp8.time.features["gemm_fp8"] * gpu.fp8_tflops / gpu.bf16_tflops
    assert total == pytest.approx(bf16.time.features["gemm"], rel=1e-9)


def test_fp8_gemm_efficiency_is_a_constant_of_its_own() -> None:
    te = CALIBRATED_PATHS["transformer_engine"][0]  # the TE path's fitted constants
    slow = te.with_values(fp8_gemm_efficiency=0.4)
    assert _plan("te-bf16-mb8", slow).time.step_seconds == pytest.approx(_plan("te-bf16-mb8").time.step_seconds)
    assert _plan("te-fp8-delayed-mb8", slow).time.step_seconds > 1.2 * _plan("te-fp8-delayed-mb8").time.step_seconds


def test_calibrate_fits_it() -> None:
    from bench_scripts import load_script

    pytest.importorskip("numpy")
    calibrate = load_script(ROOT / "bench" / "plan" / "calibrate.py", "plan_calibrate_fp8")
    i = calibrate.TIME_FEATURES.index("gemm_fp8")
    assert calibrate.TIME_CONSTANTS[i] == "fp8_gemm_efficiency" and "fp8_gemm_efficiency" in calibrate.EFFICIENCIES
    from dlmspec.plan.calibration import FITTED

    assert "fp8_gemm_efficiency" in FITTED


def test_a_constant_no_run_exercises_keeps_its_value_exactly(tmp_path) -> None:
    """bf16 runs only (every local calibration run): fp8_gemm_efficiency's feature is 0 in each, so the fit
    leaves it exactly as it was (docs/planner.md's table lists only the constants that moved)."""
    from bench_scripts import load_script

    pytest.importorskip("numpy")
    calibrate = load_script(ROOT / "bench" / "plan" / "calibrate.py", "plan_calibrate_fp8_keep")
    fixture = ROOT / "tests" / "fixtures" / "te_calibration_synthetic" / "calibration_te_synthetic.json"
    data = json.loads(fixture.read_text())
    data["runs"] = [r for r in data["runs"] if not any("precision.fp8" in o for o in r["overrides"])]
    (tmp_path / "bf16.json").write_text(json.dumps(data))
    runs, _ = calibrate.read_runs(tmp_path)
    assert len(runs) >= 4
    fitted = calibrate.fit_time(runs, DEFAULT_CALIBRATION, 0.1)
    assert fitted.fp8_gemm_efficiency == DEFAULT_CALIBRATION.fp8_gemm_efficiency
    assert fitted.gemm_efficiency != DEFAULT_CALIBRATION.gemm_efficiency
