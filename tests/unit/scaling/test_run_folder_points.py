"""What ``dlmspec fit`` reads from a run folder beyond the loss: the launch folder the spec's paths
refer to, the unique tokens and epochs from the dataset records, and the data-constrained fit of
a study whose runs repeat their data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import scaling_kit
from dlmspec.cli.commands import app
from dlmspec.scaling.runs import launch_dir, read_point


def _dataset(root: Path, tokens: int) -> dict:
    (root / "data").mkdir(exist_ok=True)
    record = {"schema": "dlmspec.dataset", "version": 1, "documents": 10, "tokens": tokens}
    (root / "data" / "x_text_document.dlmspec.json").write_text(json.dumps(record))
    # the whole dataset trains (no validation carve-out): its record's token count is the training split's
    return {"data.mock": None, "data.train": ["data/x_text_document"], "data.split": "100,0,0"}


def test_the_launch_folder_is_where_the_recorded_run_dir_ends(tmp_path: Path) -> None:
    assert launch_dir(str(tmp_path / "study" / "runs" / "a"), "runs/a") == str(tmp_path / "study")
    assert launch_dir(str(tmp_path / "elsewhere" / "a"), "runs/a") == str(tmp_path)  # moved: runs/NAME's parent
    assert launch_dir(str(tmp_path / "x" / "runs" / "a"), "/abs/runs/a") == str(tmp_path / "x")


def test_unique_tokens_and_epochs_come_from_the_dataset_record(tmp_path: Path) -> None:
    data = _dataset(tmp_path, 2_000_000)
    run = scaling_kit.write_run(tmp_path / "runs" / "r", shape=(4, 256), tokens=8_000_000, loss=3.0, data=data)
    point = read_point(str(run))
    assert point.unique_tokens == 2_000_000 and point.epochs == pytest.approx(4.0)
    short = scaling_kit.write_run(tmp_path / "runs" / "s", shape=(4, 256), tokens=500_000, loss=3.0, data=data)
    assert read_point(str(short)).unique_tokens == 500_000  # less than one epoch sees only what it draws


def test_a_dataset_without_a_record_leaves_unique_tokens_unknown_with_why(tmp_path: Path) -> None:
    data = {"data.mock": None, "data.train": ["data/y_text_document"]}
    run = scaling_kit.write_run(tmp_path / "runs" / "r", shape=(4, 256), tokens=10**6, loss=3.0, data=data)
    point = read_point(str(run))
    # the planner's words (dlmspec.data.repetition): neither the index nor the record can be read
    assert point.unique_tokens is None and "y_text_document.idx" in point.unique_why
    assert "no record" in point.unique_why


def test_a_study_with_repeated_runs_uses_the_published_r_star_below_three_levels(tmp_path: Path) -> None:
    scaling_kit.isoflop_study(tmp_path / "runs")
    data = _dataset(tmp_path, 2 * 10**8)
    for epochs in (4, 8):
        scaling_kit.write_run(tmp_path / "runs" / f"rep{epochs}", shape=(8, 512), tokens=epochs * 2 * 10**8,
                              loss=3.5, data=data)
    result = CliRunner().invoke(app, ["fit", "--sweep", str(tmp_path / "runs"), "--bootstrap", "0", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)["result"]
    constrained = doc["data_constrained"]
    assert constrained["source"] == "published" and constrained["levels"] == [4.0, 8.0]
    assert (constrained["R_star_D"], constrained["R_star_N"]) == (15.4, 5.3)
    assert doc["law"]["points"] == 12  # the repeated runs stay out of the single-epoch law
