"""``dlmspec fit RUN... [--sweep DIR] [--json] [--plot PATH]`` on run folders made in tmp_path as the
runtime writes them: the law, the compute optimum and the plot; a run without a validation loss is
named and skipped; bad input exits 2 with the file, key, why and fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import scaling_kit
from dlmspec.cli.commands import app


def run_cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    scaling_kit.isoflop_study(root)
    scaling_kit.write_run(root / "no-loss", shape=(8, 512), tokens=10**9, loss=None)
    return root


def test_a_sweep_folder_is_fitted_and_the_run_without_a_loss_is_named(study: Path) -> None:
    result = run_cli("fit", "--sweep", str(study), "--json", "--bootstrap", "20")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)["result"]
    assert [s["name"] for s in doc["skipped"]] == ["no-loss"]
    assert "no validation loss" in doc["skipped"][0]["why"]
    assert len(doc["points"]) == 12
    law = doc["law"]["law"]
    assert law["alpha"] == pytest.approx(scaling_kit.KNOWN["alpha"], abs=0.08)
    assert doc["law"]["bootstrap"] == {"resamples": 20, "failed": doc["law"]["bootstrap"]["failed"],
                                      "percentile": 95.0, "seed": 0}
    assert len(doc["optimum"]) == 3  # the three budgets present
    for row in doc["optimum"]:
        lo, hi = row["N_interval"]
        assert lo <= row["N"] <= hi
    budgets = doc["isoflops"]["budgets"]
    assert [b["points"] for b in budgets] == [4, 4, 4]
    assert doc["data_constrained"] is None  # no run repeats its data


def test_the_table_names_the_law_the_optimum_and_the_skipped_run(study: Path, tmp_path: Path) -> None:
    plot = tmp_path / "fit.png"
    result = run_cli("fit", "--sweep", str(study), "--bootstrap", "10", "--plot", str(plot))
    assert result.exit_code == 0, result.output
    for text in ("alpha", "compute-optimal", "skipped no-loss", "no validation loss", f"wrote {plot}"):
        assert text in result.stdout, text
    data = plot.read_bytes()
    assert data.startswith(b"\x89PNG") and b"dlmspec fit" in data[:65536]
    # a second fit may replace the figure it drew
    again = run_cli("fit", "--sweep", str(study), "--bootstrap", "0", "--plot", str(plot))
    assert again.exit_code == 0, again.output


def test_the_eval_elbo_and_its_standard_error_are_the_loss(tmp_path: Path) -> None:
    from dlmspec.scaling.runs import read_point

    elbo = {"count": {"nll_per_token": 3.25, "stderr_per_token": 0.02, "num_samples": 128}}
    run = scaling_kit.write_run(tmp_path / "r", shape=(4, 256), tokens=10**8, loss=9.0,
                                eval_result={"elbo": elbo})
    point = read_point(str(run))
    assert (point.loss, point.stderr) == (3.25, 0.02)
    assert "ELBO" in point.loss_source and "count" in point.loss_source
    assert point.params == scaling_kit.non_embedding((4, 256))
    assert point.flops == 6 * point.params * 10**8
    assert point.unique_tokens is None and "mock data" in point.unique_why


def test_replicates_are_pooled_by_inverse_variance(tmp_path: Path) -> None:
    from dlmspec.scaling.runs import pool_replicates, read_point

    points = []
    for i, (loss, err) in enumerate(((3.0, 0.1), (3.2, 0.2))):
        run = scaling_kit.write_run(tmp_path / f"seed{i}", shape=(4, 256), tokens=10**8, loss=None, name="rep",
                                    eval_result={"elbo": {"count": {"nll_per_token": loss, "stderr_per_token": err}}})
        points.append(read_point(str(run)))
    (pooled,) = pool_replicates(points)
    w1, w2 = 1 / 0.1**2, 1 / 0.2**2
    assert pooled.point.loss == pytest.approx((w1 * 3.0 + w2 * 3.2) / (w1 + w2))
    assert pooled.point.stderr == pytest.approx((w1 + w2) ** -0.5)
    assert len(pooled.replicates) == 2


def _issue(result) -> dict:
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is False
    return doc["issues"][0]


def test_a_folder_that_is_no_run_folder_exits_2(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    issue = _issue(run_cli("fit", str(tmp_path / "empty"), "--json"))
    assert issue["key"] == "RUN" and "metrics.jsonl" in issue["message"] and issue["hint"]


def test_an_unreadable_lock_file_exits_2_naming_it(tmp_path: Path) -> None:
    run = scaling_kit.write_run(tmp_path / "r", shape=(4, 256), tokens=10**8, loss=3.0)
    (run / "spec.lock.toml").write_text("[model\nnum_layers = ")
    issue = _issue(run_cli("fit", str(run), "--json"))
    assert issue["key"] == "spec.lock.toml" and issue["file"].endswith("spec.lock.toml")
    assert "cannot be read" in issue["message"] and issue["hint"]


def test_an_eval_file_that_is_not_the_eval_envelope_exits_2_naming_it(tmp_path: Path) -> None:
    # JSON written by something other than dlmspec eval (an empty or cut-off file is a warning instead)
    run = scaling_kit.write_run(tmp_path / "r", shape=(4, 256), tokens=10**8, loss=3.0)
    (run / "eval.json").write_text('{"nll": 3.1}')
    issue = _issue(run_cli("fit", str(run), "--json"))
    assert issue["key"] == "eval.json" and issue["file"].endswith("eval.json")


def test_fewer_runs_than_parameters_exit_2_and_name_the_skipped(tmp_path: Path) -> None:
    runs = [scaling_kit.write_run(tmp_path / f"r{i}", shape=shape, tokens=10**9, loss=3.0 - 0.1 * i)
            for i, shape in enumerate(scaling_kit.SHAPES[:3])]
    runs.append(scaling_kit.write_run(tmp_path / "nolock", shape=(4, 256), tokens=10**9, loss=3.0, lock=False))
    issue = _issue(run_cli("fit", *map(str, runs), "--json"))
    assert "3 single-epoch points for a law of 5 parameters" in issue["message"]
    assert "nolock" in issue["hint"] and "spec.lock.toml" in issue["hint"]


def test_no_run_given_exits_2() -> None:
    issue = _issue(run_cli("fit", "--json"))
    assert issue["key"] == "RUN..." and "--sweep" in issue["hint"]


def test_a_plot_over_a_file_fit_did_not_draw_needs_force(study: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"not a figure of dlmspec")
    issue = _issue(run_cli("fit", "--sweep", str(study), "--plot", str(mine), "--json"))
    assert issue["key"] == "--plot" and "--force" in issue["hint"]
    assert mine.read_bytes() == b"not a figure of dlmspec"


def test_a_plot_name_that_is_not_png_exits_2_before_fitting(study: Path, tmp_path: Path) -> None:
    target = tmp_path / "fit.txt"
    issue = _issue(run_cli("fit", "--sweep", str(study), "--plot", str(target), "--json"))
    assert issue["key"] == "--plot" and issue["hint"] == f"--plot {tmp_path / 'fit'}.png"
    assert not target.exists()


def test_a_bad_grid_or_bootstrap_exits_2(study: Path) -> None:
    assert _issue(run_cli("fit", "--sweep", str(study), "--grid", "fine", "--json"))["key"] == "--grid"
    assert _issue(run_cli("fit", "--sweep", str(study), "--bootstrap", "-1", "--json"))["key"] == "--bootstrap"
