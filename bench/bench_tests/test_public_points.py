"""bench/plan/public_points.py: the planner against public measurements, its split, its data checks."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "bench" / "results" / "plan" / "public_points.json"

from bench.plan import public_points as pp  # noqa: E402

#: How much a held-out point's absolute error may grow over the committed result before the
#: benchmark fails (planner changes that move a number by less are noise in these data).
SLACK = 0.03


@pytest.fixture(scope="module")
def predictions():
    return pp.predict()


def _copy_data(tmp_path: Path) -> Path:
    data = tmp_path / "public"
    shutil.copytree(pp.DATA, data)
    return data


def test_held_out_errors_do_not_grow_over_the_committed_result(predictions):
    committed = {p["name"]: p for p in json.loads(RESULT.read_text())["points"] if p["held_out"]}
    held = [x for x in predictions if x.held_out]
    assert sorted(x.point.name for x in held) == sorted(committed)
    for x in held:
        assert x.error is not None, (x.point.name, x.refused)
        assert abs(x.error) <= abs(committed[x.point.name]["error"]) + SLACK, (x.point.name, x.error)
    median = statistics.median(abs(x.error) for x in held)
    assert median <= json.loads(RESULT.read_text())["summary"]["held_out"]["median_abs_error"] + 0.01
    assert median <= pp.TARGET_MEDIAN  # the issue's median target holds on the held-out points


def test_every_used_point_validates_or_is_listed_as_refused_with_a_reason(predictions):
    import tomli_w

    from dlmspec.check.registry import issues_for
    from dlmspec.resolve import resolve
    from dlmspec.spec.load import load_text

    for x in predictions:
        if x.refused:
            assert len(x.refused) > 10, x.point.name
            continue
        loaded = load_text(tomli_w.dumps(pp.point_spec(x.point)), name=f"{x.point.name}.toml")
        errors = [i for i in issues_for("validate", loaded, resolve(loaded.spec)) if i.severity == "error"]
        assert not errors, (x.point.name, [str(e) for e in errors])


def test_split_holds_out_whole_families_with_a_large_an_moe_and_an_fp8_point():
    points = pp.read_points()
    cal, held = pp.split(points)
    assert {p.family for p in cal}.isdisjoint({p.family for p in held})
    assert any(p.gpus >= 512 for p in held)
    assert any(p.moe for p in held)
    assert any(p.precision != "bf16" for p in held)
    assert not [p for p in cal + held if p.use == "excluded"]


def test_split_does_not_look_at_the_measured_values():
    import dataclasses

    points = pp.read_points()
    scrambled = [dataclasses.replace(p, tokens_per_second_per_gpu=1.0 + i) for i, p in enumerate(points)]
    assert [p.name for p in pp.split(points)[1]] == [p.name for p in pp.split(scrambled)[1]]


def test_committed_fit_is_what_fit_finds_on_the_calibration_split():
    fitted = pp.fit()
    committed = pp.read_fit()
    assert fitted["constants"] == committed["constants"]
    assert fitted["gpu_compute_scale"] == committed["gpu_compute_scale"]
    assert fitted["public_host_launch_seconds"] == committed["public_host_launch_seconds"]
    held = {p.name for p in pp.split(pp.read_points())[1]}
    assert held.isdisjoint(fitted["calibration_points"])


def test_point_without_a_measured_value_is_refused_naming_file_and_key(tmp_path):
    data = _copy_data(tmp_path)
    path = data / "nemo-24.07-performance-summary.json"
    doc = json.loads(path.read_text())
    doc["points"][0]["measured"]["tokens_per_second_per_gpu"] = -3
    path.write_text(json.dumps(doc))
    with pytest.raises(pp.PublicDataError) as exc:
        pp.read_points(data)
    assert exc.value.key == "points[0].measured.tokens_per_second_per_gpu" and exc.value.file == str(path)


def test_points_file_without_its_source_commit_is_refused(tmp_path):
    data = _copy_data(tmp_path)
    path = data / "megatron-bridge-performance-summary.json"
    doc = json.loads(path.read_text())
    del doc["source"]["commit"]
    path.write_text(json.dumps(doc))
    with pytest.raises(pp.PublicDataError, match="commit"):
        pp.read_points(data)


def test_duplicate_point_names_across_files_are_refused(tmp_path):
    data = _copy_data(tmp_path)
    src = json.loads((data / "nemo-24.07-performance-summary.json").read_text())
    (data / "zz-copy.json").write_text(json.dumps(src))
    with pytest.raises(pp.PublicDataError, match="unique"):
        pp.read_points(data)


def test_excluded_point_must_say_why(tmp_path):
    data = _copy_data(tmp_path)
    path = data / "nemo-24.07-performance-summary.json"
    doc = json.loads(path.read_text())
    doc["points"][0]["use"] = "excluded"
    path.write_text(json.dumps(doc))
    with pytest.raises(pp.PublicDataError) as exc:
        pp.read_points(data)
    assert exc.value.key == "points[0].why_excluded"


def test_fit_file_with_a_calibrated_gpu_scaled_is_refused(tmp_path):
    data = _copy_data(tmp_path)
    fit = json.loads((data / "fit.json").read_text())
    fit["gpu_compute_scale"]["h200"] = 0.9
    (data / "fit.json").write_text(json.dumps(fit))
    with pytest.raises(pp.PublicDataError) as exc:
        pp.read_fit(data)
    assert exc.value.key == "gpu_compute_scale"


def test_benchmark_prints_the_table_and_writes_the_result_file(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert pp.main(["--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "held_out: 14 points" in text and "excluded: " in text
    result = json.loads(out.read_text())
    assert result["summary"]["held_out"]["points"] == 14
    assert all(p["error"] is not None or p["refused"] for p in result["points"])


def test_broken_fit_file_exits_2_naming_the_file_and_key(tmp_path, monkeypatch, capsys):
    data = _copy_data(tmp_path)
    fit = json.loads((data / "fit.json").read_text())
    fit["public_host_launch_seconds"] = "fast"
    (data / "fit.json").write_text(json.dumps(fit))
    monkeypatch.setattr(pp, "DATA", data)
    assert pp.main([]) == 2
    err = capsys.readouterr().err
    assert "fit.json" in err and "public_host_launch_seconds" in err and "Traceback" not in err
