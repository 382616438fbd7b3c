"""A study whose runs train different objectives (AR and a diffusion LM side by side) is fitted per
objective: a law, isoFLOP parabolas and optimum for each, tables, ``--json`` and ``--plot`` naming
the objective; ``--objective KIND`` fits one of them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import scaling_kit
from dlmspec.cli.commands import app

#: The diffusion runs' law: higher loss, slower in N and D than the AR runs' (scaling_kit.KNOWN).
MDM = {"E": 2.1, "A": 900.0, "B": 700.0, "alpha": 0.30, "beta": 0.26}
LAWS = {"ar": scaling_kit.KNOWN, "mdm": MDM}


def run_cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for kind, law in LAWS.items():
        scaling_kit.isoflop_study(root, law=law, objective=kind, prefix=f"{kind}-", seed=1)
    return root


def _worst_residual(fit: dict) -> float:
    """The largest |log(law's loss / point's loss)| of a fit's points under its own law."""
    from dlmspec.scaling.law import Law

    law = Law(**fit["law"]["law"])
    return max(abs(float(np.log(law.loss(p["N"], p["D"]) / p["loss"]))) for p in fit["points"])


def test_ar_and_diffusion_runs_get_a_law_and_an_optimum_each(mixed: Path) -> None:
    result = run_cli("fit", "--sweep", str(mixed), "--bootstrap", "0", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)["result"]
    assert sorted(doc["objectives"]) == ["ar", "mdm"] and doc["not_fitted"] == {} and doc["skipped"] == []
    for kind, fit in doc["objectives"].items():
        assert fit["objective"] == kind and {p["objective"] for p in fit["points"]} == {kind}
        assert fit["law"]["points"] == 12 and len(fit["optimum"]) == 3
        assert [b["points"] for b in fit["isoflops"]["budgets"]] == [4, 4, 4]
        # each law fits its own runs to their noise (0.3 %); one law through both could not
        assert _worst_residual(fit) < 0.02, kind
        assert fit["law"]["law"]["E"] == pytest.approx(LAWS[kind]["E"], abs=0.25)


def test_one_objective_is_fitted_alone_in_the_single_fit_shape(mixed: Path) -> None:
    result = run_cli("fit", "--sweep", str(mixed), "--objective", "ar", "--bootstrap", "0", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)["result"]
    assert "objectives" not in doc and doc["objective"] == "ar"
    assert {p["objective"] for p in doc["points"]} == {"ar"} and doc["law"]["points"] == 12
    assert len(doc["left_out"]) == 12 and {r["objective"] for r in doc["left_out"]} == {"mdm"}


def test_an_objective_no_run_trains_exits_2_naming_those_present(mixed: Path) -> None:
    result = run_cli("fit", "--sweep", str(mixed), "--objective", "bd3lm", "--json")
    assert result.exit_code == 2, result.output
    issue = json.loads(result.stdout)["issues"][0]
    assert issue["key"] == "--objective" and "ar, mdm" in issue["message"]


def test_the_tables_and_figures_name_each_objective(mixed: Path, tmp_path: Path) -> None:
    plot = tmp_path / "fit.png"
    result = run_cli("fit", "--sweep", str(mixed), "--bootstrap", "0", "--plot", str(plot))
    assert result.exit_code == 0, result.output
    for kind in ("ar", "mdm"):
        assert f"objective {kind}: loss from" in result.stdout
        assert f"{kind}: L(N, D) = E + A/N^alpha" in result.stdout
        assert f"{kind}: compute-optimal" in result.stdout
        figure = tmp_path / f"fit-{kind}.png"
        assert f"wrote {figure}" in result.stdout
        data = figure.read_bytes()
        assert data.startswith(b"\x89PNG") and b"dlmspec fit" in data[:65536]
    assert not plot.exists()


def test_an_objective_with_too_few_runs_is_named_and_the_others_fitted(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    scaling_kit.isoflop_study(runs, objective="ar", prefix="ar-")
    for i, shape in enumerate(scaling_kit.SHAPES[:2]):
        scaling_kit.write_run(runs / f"mdm-{i}", shape=shape, tokens=10**9, loss=3.0, objective="mdm")
    result = run_cli("fit", "--sweep", str(runs), "--bootstrap", "0", "--json")
    assert result.exit_code == 0, result.output
    envelope = json.loads(result.stdout)
    doc = envelope["result"]
    assert list(doc["objectives"]) == ["ar"]
    assert "2 single-epoch points" in doc["not_fitted"]["mdm"]["why"]
    assert any("objective mdm is not fitted" in w["message"] for w in envelope["warnings"])


def test_an_objective_that_is_no_plain_name_falls_back_to_the_locks(tmp_path: Path) -> None:
    from dlmspec.scaling.runs import read_point
    from dlmspec.spec.load import load

    # the objective names --plot files and table titles: a path or markup in a start record never reaches them
    run = scaling_kit.write_run(tmp_path / "r", shape=(4, 256), tokens=10**8, loss=3.0, objective="../../x[bold]")
    assert read_point(str(run)).objective == load(str(run / "spec.lock.toml")).spec.objective.kind
