"""`dlmspec task make addition-padded`: the addition task at fixed width (operands zero-padded to
--digits digits, the sum to --digits + 1), so each place sits at the same offset in every example;
answers are the true sums, the checker accepts them, and the files are deterministic."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.tasks.check import exact_match
from dlmspec.tasks.make import TASKS, make_splits, resolve_options


def _numbers(text: str) -> list[int]:
    return [int(part.replace(" ", "")) for part in text.replace("=", "").split("+")]


def test_padded_sums_are_true_and_every_example_has_the_same_width() -> None:
    task = TASKS["addition-padded"]
    options = resolve_options(task, {"digits": 3})
    rows = make_splits(task, options, 0, {"test": 300, "validation": 0, "train": 0})["test"]
    small = 0
    for row in rows:
        left, right = _numbers(row["prompt"])
        assert int(row["answer"].replace(" ", "")) == left + right
        assert len(row["prompt"].split()) == 3 + 1 + 3 + 1  # every digit a token, "+" and "="
        assert len(row["answer"].split()) == 4
        assert exact_match(row["answer"] + "<|endoftext|> 0 1", row["answer"])
        small += left < 100 or right < 100
    assert small > 0  # operands under 100 occur, written with leading zeros
    assert any(r["prompt"].startswith(" 0") for r in rows) and any(r["answer"].startswith(" 0") for r in rows)


def test_the_padded_task_is_written_by_the_command_deterministically(tmp_path) -> None:
    outs = []
    for name in ("a", "b"):
        res = CliRunner().invoke(app, ["task", "make", "addition-padded", "--out", str(tmp_path / name), "--digits", "2",
                                       "--train", "1000", "--valid", "100", "--test", "500"])
        assert res.exit_code == 0, res.output
        outs.append((tmp_path / name / "pretrain-train.jsonl").read_bytes())
    assert outs[0] == outs[1]
    record = json.loads((tmp_path / "a" / "task.json").read_text())
    assert record["task"] == "addition-padded" and record["options"] == {"digits": 2}
    first = json.loads(outs[0].splitlines()[0])["text"]
    assert len(first.split()) == 2 + 1 + 2 + 1 + 3
