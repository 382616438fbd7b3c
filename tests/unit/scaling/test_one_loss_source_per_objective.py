"""Every run of an objective takes its loss from one source, so one fit never mixes validation sets:
``--loss eval`` (eval.json), ``--loss valid`` (the metrics.jsonl valid record), ``--loss auto``
(eval when every run of the objective has one, else valid for all); the fit says which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import scaling_kit
from dlmspec.cli.commands import app
from dlmspec.scaling.runs import RunPoint


def run_cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _point(name: str, valid: float | None, elbo: float | None) -> RunPoint:
    sources = {}
    if valid is not None:
        sources["valid"] = (valid, None, "metrics.jsonl valid record (iteration 100)")
    if elbo is not None:
        sources["eval"] = (elbo, 0.01, "eval.json (ELBO bound, count estimator)")
    first = sources.get("eval") or sources["valid"]
    return RunPoint(run_dir=f"runs/{name}", name=name, params=10**6, total_params=2 * 10**6, tokens=10**7,
                    flops=6e13, loss=first[0], stderr=first[1], loss_source=first[2], objective="mdm", sources=sources)


def test_auto_takes_the_valid_records_unless_every_run_has_an_evaluation() -> None:
    from dlmspec.scaling.runs import select_loss

    some = [_point("a", 4.0, 4.4), _point("b", 3.9, None)]
    chosen, skipped, used, why = select_loss(some, "auto")
    assert used == "valid" and "1 of 2" in why and not skipped
    assert [(p.loss, p.stderr) for p in chosen] == [(4.0, None), (3.9, None)]
    chosen, skipped, used, _ = select_loss([_point("a", 4.0, 4.4), _point("b", 3.9, 4.3)], "auto")
    assert used == "eval" and [(p.loss, p.stderr) for p in chosen] == [(4.4, 0.01), (4.3, 0.01)]


def test_a_chosen_source_skips_the_runs_without_it_naming_them() -> None:
    from dlmspec.scaling.runs import select_loss

    chosen, skipped, used, _ = select_loss([_point("a", 4.0, 4.4), _point("b", 3.9, None)], "eval")
    assert used == "eval" and [p.name for p in chosen] == ["a"]
    assert [s.name for s in skipped] == ["b"] and "no eval.json" in skipped[0].why
    chosen, skipped, _, _ = select_loss([_point("a", None, 4.4), _point("b", 3.9, None)], "valid")
    assert [p.name for p in chosen] == ["b"] and "no valid record" in skipped[0].why
    with pytest.raises(ValueError):
        select_loss([], "best")


@pytest.fixture(scope="module")
def half_evaluated(tmp_path_factory) -> Path:
    """An isoFLOP study whose first 6 runs also have an eval.json on another validation set (10 % higher)."""
    root = tmp_path_factory.mktemp("runs")
    folders = scaling_kit.isoflop_study(root)
    for folder in folders[:6]:
        valid = json.loads((folder / "metrics.jsonl").read_text().splitlines()[-1])["loss"]
        elbo = {"count": {"nll_per_token": 1.1 * valid, "stderr_per_token": 0.01}}
        (folder / "eval.json").write_text(json.dumps({"ok": True, "result": {"elbo": elbo}}))
    return root


def test_a_study_half_evaluated_is_fitted_on_the_valid_records_and_says_so(half_evaluated: Path) -> None:
    result = run_cli("fit", "--sweep", str(half_evaluated), "--bootstrap", "0", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)["result"]
    assert doc["loss"]["source"] == "valid" and "6 of 12" in doc["loss"]["why"]
    assert {p["loss_source"].split(" (")[0] for p in doc["points"]} == {"metrics.jsonl valid record"}
    table = run_cli("fit", "--sweep", str(half_evaluated), "--bootstrap", "0")
    assert "objective mdm: loss from metrics.jsonl valid records for every run (auto: 6 of 12" in table.stdout


def test_loss_eval_fits_the_evaluated_runs_and_names_the_others(half_evaluated: Path) -> None:
    result = run_cli("fit", "--sweep", str(half_evaluated), "--bootstrap", "0", "--loss", "eval", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)["result"]
    assert doc["loss"]["source"] == "eval" and len(doc["points"]) == 6
    assert all(p["loss_source"].startswith("eval.json") and p["stderr"] == 0.01 for p in doc["points"])
    assert len(doc["skipped"]) == 6 and all("no eval.json" in s["why"] for s in doc["skipped"])


def test_loss_valid_reads_no_eval_file(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    scaling_kit.isoflop_study(runs)
    (runs / "c0-4x256" / "eval.json").write_text('{"nll": 3.1}')  # not the eval envelope: refused when read
    assert run_cli("fit", "--sweep", str(runs), "--bootstrap", "0", "--json").exit_code == 2
    result = run_cli("fit", "--sweep", str(runs), "--bootstrap", "0", "--loss", "valid", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["result"]["law"]["points"] == 12


def test_an_unknown_loss_source_exits_2() -> None:
    result = run_cli("fit", "runs/x", "--loss", "best", "--json")
    assert result.exit_code == 2
    issue = json.loads(result.stdout)["issues"][0]
    assert issue["key"] == "--loss" and "--loss valid" in issue["hint"]
