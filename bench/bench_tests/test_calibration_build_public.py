"""bench/calibration/build.py's public block: the public points' fit reaches calibration.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("numpy")

from bench.calibration import build  # noqa: E402


def _copy_data(tmp_path: Path) -> Path:
    data = tmp_path / "calibration"
    shutil.copytree(build.DATA, data, ignore=shutil.ignore_patterns("__pycache__", "*.py", "logs"))
    return data


def test_manifest_that_leaves_out_a_public_file_is_refused(tmp_path):
    data = _copy_data(tmp_path)
    man = json.loads((data / "manifest.json").read_text())
    man["public"]["runs"] = man["public"]["runs"][1:]
    (data / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(build.CalibrationDataError) as exc:
        build.render(data)
    assert exc.value.key == "public.runs"


def test_public_fit_naming_a_point_outside_the_calibration_split_is_refused(tmp_path):
    data = _copy_data(tmp_path)
    fit = json.loads((data / "public" / "fit.json").read_text())
    fit["calibration_points"].append(fit["held_out_points"][0])
    (data / "public" / "fit.json").write_text(json.dumps(fit))
    with pytest.raises(build.CalibrationDataError) as exc:
        build.render(data)
    assert exc.value.key == "calibration_points" and "refit" in exc.value.why


def test_te_path_constants_are_the_public_fit_over_the_one_gpu_fit():
    from dlmspec.plan.calibration import CALIBRATED_PATHS, PUBLIC_FITTED, TE_FITTED

    fit = json.loads((build.DATA / "public" / "fit.json").read_text())
    te = CALIBRATED_PATHS["transformer_engine"][0]
    for name, value in fit["constants"].items():
        assert PUBLIC_FITTED[name] == value == getattr(te, name)
    assert te.gpu_compute_scale == fit["gpu_compute_scale"]
    assert te.gemm_efficiency == TE_FITTED["gemm_efficiency"]  # the one-GPU fit stays under it
    assert CALIBRATED_PATHS["local+sdpa"][0].nvlink_efficiency != te.nvlink_efficiency
