"""bench/common.py ``read_metrics``: the one reader of a run's ``metrics.jsonl`` for bench scripts
(through the compiler's ``dlmspec.cli.runs.iter_metrics``). A line cut mid-record (a run killed
while it wrote), a line that is not a JSON object or not UTF-8 is skipped and counted; a blank
line is neither a record nor skipped; an empty or missing file has no records; a run folder reads
its ``metrics.jsonl``; a FIFO or a line past the cap ends the reading without an exception. And
the loss-agreement check reads a killed run's curve up to its cut line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for folder in (ROOT / "bench", ROOT / "bench" / "throughput", Path(__file__).resolve().parent):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import common  # noqa: E402
import metrics_kit  # noqa: E402

from dlmspec.files import MAX_LINE_BYTES  # noqa: E402


def test_a_cut_last_line_is_skipped_and_counted(tmp_path) -> None:
    path = metrics_kit.write_run_folder(tmp_path / "run", cut=True)
    rows = common.read_metrics(path)
    assert rows == metrics_kit.run_records()
    assert rows.skipped == 1 and rows.found and rows.refused is None and rows.path == path
    assert common.last(rows, "exit") == {"event": "exit", "time": rows[-1]["time"], "iteration": 12, "reason": "done"}


def test_blank_lines_are_neither_records_nor_skipped(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('\n{"event": "start", "iteration": 0}\n   \n\t\n{"event": "train", "iteration": 1, "loss": 2.0}\n\n')
    rows = common.read_metrics(path)
    assert rows == [{"event": "start", "iteration": 0}, {"event": "train", "iteration": 1, "loss": 2.0}]
    assert rows.skipped == 0


def test_lines_that_are_not_json_objects_are_skipped_and_counted(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = ['[1, 2]', '42', '"train"', 'null', 'not json at all', '{"event": "train", "iteration": 1}',
             '{"event": "valid", "iteration": 1, "loss": 3.5}']
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'{"event": "train", "note": "\xff\xfe"}\n')
    rows = common.read_metrics(path)
    assert rows == [{"event": "train", "iteration": 1}, {"event": "valid", "iteration": 1, "loss": 3.5}]
    assert rows.skipped == 6  # four non-objects, one not JSON, one not UTF-8
    assert common.events(rows, "valid", "eval") == [rows[1]] and common.last(rows, "checkpoint") is None


def test_an_empty_file_has_no_records(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"")
    rows = common.read_metrics(path)
    assert rows == [] and rows.found and rows.skipped == 0 and rows.refused is None


def test_a_missing_file_has_no_records_and_raises_nothing(tmp_path) -> None:
    rows = common.read_metrics(tmp_path / "runs" / "never" / "metrics.jsonl")
    assert rows == [] and not rows.found and rows.skipped == 0


def test_a_run_folder_reads_its_metrics_file_and_a_copy_reads_by_its_own_name(tmp_path) -> None:
    path = metrics_kit.write_run_folder(tmp_path / "run")
    copy = metrics_kit.write_run_folder(tmp_path / "logs", name="metrics-rl.jsonl")
    from_folder, from_file, from_copy = (common.read_metrics(tmp_path / "run"), common.read_metrics(str(path)),
                                         common.read_metrics(copy))
    assert from_folder == from_file == from_copy == metrics_kit.run_records()
    assert from_folder.path == from_file.path == path and from_copy.path == copy
    no_run = common.read_metrics(tmp_path / "logs")  # a folder without a metrics.jsonl
    assert no_run == [] and not no_run.found and no_run.path == tmp_path / "logs" / "metrics.jsonl"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_without_blocking_or_raising(tmp_path) -> None:
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    rows = common.read_metrics(tmp_path)
    assert rows == [] and rows.found and "not a regular file" in rows.refused


def test_a_line_past_the_cap_ends_the_reading_keeping_the_records_before_it(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps({"event": "start", "iteration": 0}) + "\n")
        f.write('{"event": "train", "pad": "' + "x" * (MAX_LINE_BYTES + 1) + '"}\n')
        f.write(json.dumps({"event": "exit", "iteration": 1}) + "\n")
    rows = common.read_metrics(path)
    assert rows == [{"event": "start", "iteration": 0}] and "longer than" in rows.refused


def test_loss_agreement_reads_a_killed_runs_curve_up_to_its_cut_line(tmp_path) -> None:
    import loss_agreement

    killed = metrics_kit.write_run_folder(tmp_path / "killed", cut=True)
    whole = metrics_kit.write_run_folder(tmp_path / "whole", cut=False)
    losses = loss_agreement.read_losses(killed)
    assert losses == loss_agreement.read_losses(whole) == {r["iteration"]: r["loss"] for r in metrics_kit.run_records()
                                                         if r["event"] == "train"}
    result = loss_agreement.check_files(killed, whole, steps=12)
    assert result["agree"] and result["complete"] and result["max_rel_diff"] == 0.0
    with pytest.raises(loss_agreement.MetricsError, match="no such file"):
        loss_agreement.read_losses(tmp_path / "absent.jsonl")


def test_the_te_calibration_measurement_of_a_killed_run_keeps_its_steps(tmp_path) -> None:
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    import te_calibration

    killed = te_calibration.summarize(metrics_kit.write_run_folder(tmp_path / "killed", cut=True), 3)
    assert killed == te_calibration.summarize(metrics_kit.write_run_folder(tmp_path / "whole", cut=False), 3)
    assert killed["step_seconds"] == 0.101 and killed["steps_measured"] == 9 and killed["host_launch_us"] == 7.25
