"""An ``eval.json`` that records no finished evaluation (empty: a study's time budget stopped the
evaluation before it printed; cut off while printing; the envelope of a failed evaluation) leaves
its run in the fit with the training's valid loss and a warning naming the file, instead of
refusing the whole sweep; an ``eval.json`` put there by something else is still refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import scaling_kit
from dlmspec.cli.commands import app
from dlmspec.scaling.runs import read_point

UNFINISHED = {
    "empty": "",
    "blank": "\n",
    "cut-off": '{"command": "eval", "ok": true, "result": {"elbo": {"count": {"nll_per_token": 3.',
    "failed": json.dumps({"command": "eval", "ok": False, "result": None,
                          "issues": [{"key": "--data", "message": "no such dataset"}]}),
}


@pytest.mark.parametrize("kind", sorted(UNFINISHED))
def test_an_unfinished_eval_file_leaves_the_run_in_the_fit_with_a_warning_naming_it(tmp_path: Path, kind: str) -> None:
    runs = tmp_path / "runs"
    scaling_kit.isoflop_study(runs)
    stopped = runs / "c0-4x256"
    (stopped / "eval.json").write_text(UNFINISHED[kind])
    result = CliRunner().invoke(app, ["fit", "--sweep", str(runs), "--bootstrap", "0", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    named = [w for w in doc["warnings"] if str(stopped / "eval.json") in w["message"]]
    assert len(named) == 1 and "its loss is not used" in named[0]["message"]
    (point,) = [p for p in doc["result"]["points"] if p["name"] == "c0-4x256"]
    assert point["loss_source"].startswith("metrics.jsonl valid record")
    assert doc["result"]["law"]["points"] == 12  # no run left out


def test_the_point_of_a_run_with_an_empty_eval_file_has_only_its_valid_loss(tmp_path: Path) -> None:
    run = scaling_kit.write_run(tmp_path / "r", shape=(4, 256), tokens=10**8, loss=3.5)
    (run / "eval.json").write_text("")
    point = read_point(str(run))
    assert (point.loss, point.stderr) == (3.5, None) and set(point.sources) == {"valid"}
    assert len(point.notes) == 1 and "is empty" in point.notes[0] and str(run / "eval.json") in point.notes[0]


def test_a_run_with_an_empty_eval_file_and_no_valid_record_is_skipped_with_both_reasons(tmp_path: Path) -> None:
    run = scaling_kit.write_run(tmp_path / "r", shape=(4, 256), tokens=10**8, loss=None)
    (run / "eval.json").write_text("")
    skipped = read_point(str(run))
    assert "no valid record" in skipped.why and "is empty" in skipped.why


def test_an_eval_file_that_is_no_regular_file_is_still_refused(tmp_path: Path) -> None:
    run = scaling_kit.write_run(tmp_path / "r", shape=(4, 256), tokens=10**8, loss=3.0)
    os.mkfifo(run / "eval.json")  # read, it would block: never read, never taken for an unfinished evaluation
    result = CliRunner().invoke(app, ["fit", str(run), "--json"])
    assert result.exit_code == 2, result.output
    issue = json.loads(result.stdout)["issues"][0]
    assert issue["key"] == "eval.json" and issue["hint"]


def test_a_sweep_names_the_runs_that_never_started(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    scaling_kit.isoflop_study(runs)
    never = scaling_kit.write_run(runs / "never-started", shape=(4, 256), tokens=None, loss=None)
    (never / "metrics.jsonl").unlink()  # the study's budget ran out before it started: only its lock was kept
    result = CliRunner().invoke(app, ["fit", "--sweep", str(runs), "--bootstrap", "0", "--json"])
    assert result.exit_code == 0, result.output
    (skipped,) = json.loads(result.stdout)["result"]["skipped"]
    assert skipped["name"] == "never-started" and "never started" in skipped["why"]


def test_a_damaged_metrics_file_is_not_called_a_run_that_never_started(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    scaling_kit.isoflop_study(runs)
    damaged = scaling_kit.write_run(runs / "damaged", shape=(4, 256), tokens=10**8, loss=3.0)
    metrics = damaged / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if '"start"' in line)
    lines[start] = lines[start][: len(lines[start]) // 2]  # the start record cut short
    metrics.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["fit", "--sweep", str(runs), "--bootstrap", "0", "--json"])
    assert result.exit_code == 0, result.output
    (skipped,) = json.loads(result.stdout)["result"]["skipped"]
    assert skipped["name"] == "damaged", skipped
    assert "never started" not in skipped["why"] and "did not parse" in skipped["why"], skipped["why"]
