"""bench/calibration/build.py: dlmspec/plan/calibration.py is generated from the calibration data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("numpy")

from bench.calibration import build  # noqa: E402


def _copy_data(tmp_path: Path) -> Path:
    data = tmp_path / "calibration"
    shutil.copytree(build.DATA, data, ignore=shutil.ignore_patterns("__pycache__", "*.py", "logs"))
    return data


def test_render_reproduces_the_committed_calibration_py_byte_for_byte():
    text = build.render()
    assert text.startswith(build.MARKER + "\n# Sources: ")
    assert text == (ROOT / "dlmspec" / "plan" / "calibration.py").read_text(encoding="utf-8")


def test_generated_provenance_names_data_files_not_work_periods():
    from dlmspec.plan import calibration

    for text in (calibration.FITTED_FROM, calibration.TE_FITTED_FROM):
        assert text.startswith("bench/calibration/") and "session" not in text
    src = (ROOT / "dlmspec" / "plan" / "calibration.py").read_text(encoding="utf-8")
    assert "session" not in src.lower() and "issue" not in src.lower()


def test_manifest_that_leaves_out_a_run_file_is_refused(tmp_path):
    data = _copy_data(tmp_path)
    man = json.loads((data / "manifest.json").read_text())
    dropped = man["paths"][0]["runs"].pop(0)
    (data / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(build.CalibrationDataError) as err:
        build.render(data)
    assert err.value.key == "paths[0].runs" and dropped in err.value.why


def test_fit_made_on_other_files_is_refused(tmp_path):
    data = _copy_data(tmp_path)
    fit_path = data / "te" / "h200" / "fit.json"
    fit = json.loads(fit_path.read_text())
    fit["files"] = fit["files"][:1]
    fit_path.write_text(json.dumps(fit))
    with pytest.raises(build.CalibrationDataError) as err:
        build.render(data)
    assert err.value.key == "files" and "refit" in err.value.why


def test_run_with_a_negative_step_time_is_refused(tmp_path):
    data = _copy_data(tmp_path)
    path = data / "local" / "h200" / "2gpu-tp2-sp-2026-11-30.json"
    runs = json.loads(path.read_text())
    runs["runs"][0]["step_seconds"] = -0.1
    path.write_text(json.dumps(runs))
    with pytest.raises(build.CalibrationDataError) as err:
        build.render(data)
    assert err.value.key == "runs[0].step_seconds" and err.value.value == -0.1


def test_a_fitted_constant_that_is_not_positive_is_refused(tmp_path):
    data = _copy_data(tmp_path)
    fit_path = data / "local" / "h200" / "fit.json"
    fit = json.loads(fit_path.read_text())
    fit["constants"]["gemm_efficiency"] = 0
    fit_path.write_text(json.dumps(fit))
    with pytest.raises(build.CalibrationDataError) as err:
        build.render(data)
    assert err.value.key == "constants.gemm_efficiency"


def test_a_new_run_widens_the_generated_measured_range(tmp_path):
    """A run at a longer sequence, added with its file in the manifest, shows in LOCAL_MEASURED."""
    data = _copy_data(tmp_path)
    src = data / "local" / "h200" / "2gpu-tp2-sp-2026-11-30.json"
    rec = json.loads(src.read_text())
    new = {"date": "2026-12-06", "runs": [{"name": "demo-mdm-b32-s512", "base": "specs/demo-dlm.toml",
                                           "overrides": ["train.seq_length=8192", "train.micro_batch_size=1",
                                                         "train.global_batch_size=1"],
                                           "peak_allocated_bytes": 9e9, "step_seconds": 0.5}]}
    assert rec["runs"]
    (data / "local" / "h200" / "seq8192-2026-12-06.json").write_text(json.dumps(new))
    man = json.loads((data / "manifest.json").read_text())
    man["paths"][0]["runs"] = sorted(man["paths"][0]["runs"] + ["seq8192-2026-12-06.json"])
    (data / "manifest.json").write_text(json.dumps(man))
    fit_path = data / "local" / "h200" / "fit.json"
    fit = json.loads(fit_path.read_text())
    fit["files"] = man["paths"][0]["runs"]
    fit_path.write_text(json.dumps(fit))
    text = build.render(data)
    assert "    seq_length=(512, 8192)," in text and "(71 runs)" in text


def test_refit_of_the_committed_data_stays_near_the_committed_constants():
    """The fit on today's planner and data moves no committed constant by more than 10%
    (it is pulled towards them; a larger move means the planner or data changed: refit)."""
    from bench.calibration import fit

    for path, r in fit.refit().items():
        for name, after in r["after"].items():
            before = r["before"][name]
            assert abs(after - before) <= 0.10 * before, (path, name, before, after)
