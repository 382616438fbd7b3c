"""``dlmspec.cli.runs.iter_metrics``: the one reader of a metrics file (``read_run`` for ``dlmspec
show`` / ``plot`` / ``fit``, and bench/common.py's ``read_metrics``): each record of a non-blank
line in order, ``None`` for a line that is not a JSON object (a line cut mid-record, a list, a
number, bytes that are not UTF-8), refusing a file that is not a regular one."""

from __future__ import annotations

import os

import pytest

from dlmspec.cli.runs import iter_metrics, read_run
from dlmspec.files import FileRefused


def test_lines_that_are_not_records_come_as_none_in_their_place(tmp_path) -> None:
    path = tmp_path / "metrics-copy.jsonl"
    path.write_bytes(b'{"event": "start"}\n\n[1]\n7\n\xff\n  \n{"event": "train", "iteration": 1}\n{"event": "tr')
    assert list(iter_metrics(path)) == [{"event": "start"}, None, None, None, {"event": "train", "iteration": 1}, None]


def test_read_run_counts_the_same_lines_as_skipped(tmp_path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"event": "start"}\n[1]\n{"event": "exit"}\n{"event": "tr')
    log = read_run(str(tmp_path))
    assert log.records == [{"event": "start"}, {"event": "exit"}] and log.skipped == 2


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_before_a_record(tmp_path) -> None:
    os.mkfifo(tmp_path / "metrics.jsonl")
    with pytest.raises(FileRefused, match="not a regular file"):
        next(iter_metrics(tmp_path / "metrics.jsonl"))
