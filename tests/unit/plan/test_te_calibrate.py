"""bench/plan/calibrate.py on Transformer Engine runs: the TE path gets constants of its own,
fitted on the TE records only (held-out ones left out of the fit and reported against it), written by
bench/calibration/fit.py --write into the TE fit.json that dlmspec/plan/calibration.py's TE block is
rendered from (bench/calibration/build.py), after which the planner's provenance says "calibrated" for TE.

The results are tests/fixtures/te_calibration_synthetic/calibration_te_synthetic.json: SYNTHETIC records,
the plans of bench/plan/te_matrix.json under made-up TE constants (:data:`TRUE_TE`) with 1% noise, for
this test only (never under bench/results). Regenerate with ``.venv/bin/python tests/unit/plan/test_te_calibrate.py``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
from bench_scripts import load_script  # noqa: E402

from dlmspec.plan import make_plan  # noqa: E402
from dlmspec.plan.calibration import DEFAULT_CALIBRATION, FITTED_FROM  # noqa: E402
from dlmspec.resolve import resolve  # noqa: E402
from dlmspec.spec.load import load  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "te_calibration_synthetic" / "calibration_te_synthetic.json"
MATRIX = ROOT / "bench" / "plan" / "te_matrix.json"
GiB = 1024**3
#: Made-up "true" TE constants the synthetic records are planned with (not measurements).
TRUE_TE = DEFAULT_CALIBRATION.with_values(
    activation_scale=0.92, allocated_overhead_bytes=1.2 * GiB, gemm_efficiency=0.62, attention_efficiency=0.5,
    memory_efficiency=0.75, step_overhead_seconds=0.03, allocator_reserve_fraction=0.025, fp8_gemm_efficiency=0.45)


def _resolved(entry: dict):
    return resolve(load(ROOT / entry["base"], entry["overrides"]).spec)


def synthetic_records() -> dict:
    """The fixture's content: each matrix entry planned under TRUE_TE, 1% noise, the cheapest twice."""
    rng = random.Random(21)
    runs = []
    entries = json.loads(MATRIX.read_text())
    for entry in entries + [e for e in entries if e["name"] == "te-bf16-mb4"]:
        # the backend named, as calibrate.py plans a TE record without one as PyTorch row chunks
        entry = {**entry, "overrides": entry["overrides"] + ['kernels.fused_linear_impl="liger"']}
        plan = make_plan(_resolved(entry), TRUE_TE, impl="transformer_engine")
        alloc = plan.peak_allocated_bytes * (1 + rng.uniform(-0.01, 0.01))
        runs.append({"name": entry["name"], "base": entry["base"], "overrides": entry["overrides"],
                     "impl": "transformer_engine", "held_out": entry["held_out"], "gpus": 1,
                     "peak_allocated_bytes": int(alloc),
                     "peak_reserved_bytes": int(alloc * (1 + TRUE_TE.allocator_reserve_fraction) * (1 + rng.uniform(0, 0.01))),
                     "step_seconds": plan.time.step_seconds * (1 + rng.uniform(-0.01, 0.01))})
    return {"synthetic": True,
            "description": "SYNTHETIC, for tests/unit/plan/test_te_calibrate.py only: bench/plan/te_matrix.json planned "
                           "with made-up TE constants (TRUE_TE there) plus 1% noise. Not a measurement; never copy "
                           "it to bench/results/.",
            "date": "2000-01-01", "runs": runs}


def test_the_fixture_is_labelled_synthetic() -> None:
    data = json.loads(FIXTURE.read_text())
    assert data["synthetic"] is True and data["description"].startswith("SYNTHETIC")
    assert not list((ROOT / "bench" / "results").glob("*synthetic*"))


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    """The fixture as the TE path's run file of a copy of bench/calibration/: fit.py --write --only
    transformer_engine, calibration.py rendered from that data (build.py), and calibrate.py's docs
    tables written into a copy of docs/planner-methods.md."""
    pytest.importorskip("numpy")
    from calibration_data_kit import calibration_copy

    tmp = tmp_path_factory.mktemp("tecal")
    data = calibration_copy(tmp, "transformer_engine", {FIXTURE.name: json.loads(FIXTURE.read_text())})
    fit = load_script(ROOT / "bench" / "calibration" / "fit.py", "calibration_fit_te")
    assert fit.main(["--write", "--data", str(data), "--only", "transformer_engine"]) == 0
    calib_py, docs = tmp / "calibration.py", tmp / "planner.md"
    calib_py.write_text(load_script(ROOT / "bench" / "calibration" / "build.py", "calibration_build_te").render(data))
    docs.write_text((ROOT / "docs" / "planner-methods.md").read_text())
    calibrate = load_script(ROOT / "bench" / "plan" / "calibrate.py", "plan_calibrate_te")
    assert calibrate.main(["--results", str(FIXTURE.parent), "--docs", str(docs)]) == 0
    return load_script(calib_py, "te_calibration_written"), docs.read_text()


def test_te_constants_are_fitted_and_the_local_ones_kept(ingested) -> None:
    mod, _ = ingested
    assert "transformer_engine" in mod.CALIBRATED_PATHS
    te, measured = mod.CALIBRATED_PATHS["transformer_engine"]
    assert mod.TE_FITTED_FROM.startswith("bench/calibration/te/h200: calibration_te_synthetic.json")
    assert measured.runs == 7 and measured.fp8 == (False, True) and measured.num_experts == (8,)  # held out: not fitted
    assert measured.micro_batch == (4, 16) and measured.seq_length == (4096, 4096)
    assert mod.DEFAULT_CALIBRATION.to_dict() == DEFAULT_CALIBRATION.to_dict() and mod.FITTED_FROM == FITTED_FROM
    # One model shape at one sequence length: GEMM and attention time grow alike with the micro batch,
    # so the fit pins their sum, not each efficiency (the plans are what is checked, below); the fp8
    # GEMMs' constant moves on its own, below the bf16 one, as in the made-up truth.
    assert te.fp8_gemm_efficiency < te.gemm_efficiency and te.fp8_gemm_efficiency < DEFAULT_CALIBRATION.fp8_gemm_efficiency
    assert te.allocator_reserve_fraction == pytest.approx(0.03, abs=0.006)


def test_te_plans_match_the_records_held_out_ones_included(ingested) -> None:
    mod, _ = ingested
    te, _ = mod.CALIBRATED_PATHS["transformer_engine"]
    worst_before = 0.0
    for rec in json.loads(FIXTURE.read_text())["runs"]:
        entry = {"base": rec["base"], "overrides": rec["overrides"]}
        plan = make_plan(_resolved(entry), te, impl="transformer_engine")
        reserved = plan.peak_allocated_bytes + plan.memory.peak.breakdown["allocator_reserve"]
        assert plan.peak_allocated_bytes / rec["peak_allocated_bytes"] - 1 == pytest.approx(0, abs=0.05), rec["name"]
        assert reserved / rec["peak_reserved_bytes"] - 1 == pytest.approx(0, abs=0.05), rec["name"]
        assert plan.time.step_seconds / rec["step_seconds"] - 1 == pytest.approx(0, abs=0.15), rec["name"]
        before = make_plan(_resolved(entry), impl="transformer_engine")  # the committed (local) constants
        worst_before = max(worst_before, abs(before.time.step_seconds / rec["step_seconds"] - 1))
    assert worst_before > 0.15  # the fit had something to fix


def test_provenance_says_calibrated_on_the_te_path(ingested, monkeypatch) -> None:
    import importlib

    provenance = importlib.import_module("dlmspec.plan.provenance")  # the package exports a function of that name
    mod, _ = ingested
    monkeypatch.setattr(provenance, "CALIBRATED_PATHS", mod.CALIBRATED_PATHS)
    monkeypatch.setattr(provenance, "FITTED_FROM_BY_PATH", mod.FITTED_FROM_BY_PATH)
    entry = json.loads(MATRIX.read_text())[0]
    plan = make_plan(_resolved(entry))
    prov = plan.to_dict()["provenance"]
    assert prov["layer_path"] == "transformer_engine"
    assert prov["calibration"]["status"] == "calibrated" and prov["calibration"]["fitted_on"] == "transformer_engine"
    assert prov["calibration"]["fitted_from"].startswith("bench/calibration/te/h200: calibration_te_synthetic.json")
    assert not prov["calibration"]["text"].startswith("UNCALIBRATED")
    assert plan.calibration.gemm_efficiency == mod.CALIBRATED_PATHS["transformer_engine"][0].gemm_efficiency
    assert prov["outside_measured"] == []  # a matrix entry is inside what the TE runs covered


def test_docs_get_the_te_table(ingested) -> None:
    _, docs = ingested
    section = docs.split("<!-- te-calibration:begin -->", 1)[1].split("<!-- te-calibration:end -->", 1)[0]
    for entry in json.loads(MATRIX.read_text()):
        assert f"| {entry['name']} |" in section
    assert "held out" in section and "calibration_te_synthetic.json" in section
    # the local path's section is left as it was (the fixture has no local run)
    local = (ROOT / "docs" / "planner-methods.md").read_text().split("<!-- calibration:begin -->", 1)[1]
    assert local.split("<!-- calibration:end -->", 1)[0] in docs


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(synthetic_records(), indent=1) + "\n")
    print(f"wrote {FIXTURE.relative_to(ROOT)}")


def test_te_measured_matches_the_committed_te_runs() -> None:
    """calibration.py's TE block is what bench/results/ holds: no TE record, no TE constants; TE records
    ingested, TE_MEASURED is their range (as test_measured_range_matches_the_committed_runs for local)."""
    pytest.importorskip("numpy")
    from dlmspec.plan.calibration import CALIBRATED_PATHS, TE_FITTED, TE_MEASURED

    calibrate = load_script(ROOT / "bench" / "plan" / "calibrate.py", "plan_calibrate_te_range")
    runs, _ = calibrate.read_runs(calibrate.RESULTS)
    te = [r for r in runs if calibrate.path_of(r) == calibrate.TE and not r.held_out]
    if not te:
        assert TE_FITTED is None and TE_MEASURED is None and "transformer_engine" not in CALIBRATED_PATHS
    else:
        got = calibrate.measured_range(te, calibrate.TE)
        assert TE_MEASURED is not None and got == {k: getattr(TE_MEASURED, k) for k in got}


def test_holdout_compare_reads_the_records(tmp_path) -> None:
    te_holdout = load_script(ROOT / "bench" / "plan" / "te_holdout.py", "plan_te_holdout")
    out = tmp_path / "compare.json"
    te_holdout.compare(ROOT / "bench" / "plan" / "te_holdout_predictions.json", FIXTURE, out)
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {e["name"] for e in json.loads(MATRIX.read_text())}
    assert rows["te-bf16-mb4"]["measurements"] == 2 and rows["te-bf16-mb12"]["held_out"] is True
    assert all(r["time_error"] is not None and r["reserved_error"] is not None for r in rows.values())


def test_te_only_leaves_the_local_path_alone(tmp_path) -> None:
    """calibrate.py --te-only writes the TE table and leaves the local one; fit.py --write --only
    transformer_engine refits the TE constants and neither refits nor rewrites the local ones (a
    local refit from the committed constants moves them a little, and with them every local plan)."""
    pytest.importorskip("numpy")
    import shutil

    from calibration_data_kit import calibration_copy

    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(FIXTURE, results / FIXTURE.name)
    (results / "local.json").write_text(json.dumps({"runs": [
        {"name": "demo-mdm-b32-s512", "peak_allocated_bytes": 9 * GiB, "step_seconds": 0.2},
        {"name": "demo-mdm-b8-s2048", "peak_allocated_bytes": 9 * GiB, "step_seconds": 0.2}]}))
    docs = tmp_path / "planner.md"
    docs.write_text((ROOT / "docs" / "planner-methods.md").read_text())
    calibrate = load_script(ROOT / "bench" / "plan" / "calibrate.py", "plan_calibrate_te_only")
    assert calibrate.main(["--results", str(results), "--docs", str(docs), "--te-only"]) == 0
    local = (ROOT / "docs" / "planner-methods.md").read_text().split("<!-- calibration:begin -->", 1)[1]
    assert local.split("<!-- calibration:end -->", 1)[0] in docs.read_text()
    data = calibration_copy(tmp_path, "transformer_engine", {FIXTURE.name: json.loads(FIXTURE.read_text())})
    local_fit = (data / "local" / "h200" / "fit.json").read_text()
    fit = load_script(ROOT / "bench" / "calibration" / "fit.py", "calibration_fit_te_only")
    assert fit.main(["--write", "--data", str(data), "--only", "transformer_engine"]) == 0
    assert (data / "local" / "h200" / "fit.json").read_text() == local_fit
    assert json.loads((data / "te" / "h200" / "fit.json").read_text())["files"] == [FIXTURE.name]
    original = (ROOT / "dlmspec" / "plan" / "calibration.py").read_text()
    written = load_script(ROOT / "bench" / "calibration" / "build.py", "calibration_build_te_only").render(data)
    assert written.split("# te-calibration:begin")[0] == original.split("# te-calibration:begin")[0]
    assert "TE_FITTED: dict[str, float] | None = {" in written and written != original