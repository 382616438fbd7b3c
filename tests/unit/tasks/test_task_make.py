"""`dlmspec task make` and dlmspec/tasks/make.py: deterministic, disjoint splits with correct answers,
the training-data formats, option errors and never overwriting without --force."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.tasks.check import exact_match
from dlmspec.tasks.make import TASKS, TaskOptionError, make_splits, resolve_options, task_files


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def _digits(text: str) -> int:
    return int(text.replace(" ", ""))


def test_same_seed_gives_byte_identical_files_and_another_seed_other_rows(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder, seed in ((a, "3"), (b, "3"), (c, "4")):
        res = run("task", "make", "addition", "--out", str(folder), "--seed", seed, "--train", "2000",
                  "--valid", "100", "--test", "500")
        assert res.exit_code == 0, res.output
    names = sorted(os.listdir(a))
    assert names == ["pretrain-train.jsonl", "pretrain-validation.jsonl", "sft-train.jsonl", "sft-validation.jsonl",
                     "task.json", "test-plain.jsonl", "test.jsonl", "train.jsonl", "validation-plain.jsonl",
                     "validation.jsonl"]
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    assert (a / "test.jsonl").read_bytes() != (c / "test.jsonl").read_bytes()
    record = json.loads((a / "task.json").read_text())
    assert record["files"]["test.jsonl"] == hashlib.sha256((a / "test.jsonl").read_bytes()).hexdigest()
    assert record["options"] == {"digits": 5} and record["seed"] == 3


def test_splits_are_disjoint_and_test_set_does_not_depend_on_train_size():
    task = TASKS["addition"]
    opts = resolve_options(task, {"digits": 2})
    small = make_splits(task, opts, 7, {"test": 500, "validation": 300, "train": 1000})
    large = make_splits(task, opts, 7, {"test": 500, "validation": 300, "train": 3000})
    prompts = [r["prompt"] for split in small.values() for r in split]
    assert len(prompts) == len(set(prompts)) == 1800
    assert small["test"] == large["test"] and small["validation"] == large["validation"]


def test_answers_are_the_sum_and_the_sorted_list_and_match_themselves():
    add = make_splits(TASKS["addition"], {"digits": 4}, 0, {"test": 200, "validation": 0, "train": 0})["test"]
    for row in add:
        left, right = row["prompt"].rstrip(" =").split(" +")
        assert _digits(row["answer"]) == _digits(left) + _digits(right)
        assert all(len(tok) == 1 for tok in row["prompt"].split() if tok not in "+=")  # one digit per word
        assert exact_match(row["answer"] + "<|endoftext|> 1 2", row["answer"])
    srt = make_splits(TASKS["sorting"], {"length": 6, "max_value": 9}, 0, {"test": 200, "validation": 0, "train": 0})
    for row in srt["test"]:
        values = [int(v) for v in row["prompt"].split()[1:-1]]
        assert [int(v) for v in row["answer"].split()] == sorted(values) and len(values) == 6


def test_training_files_hold_prompt_plus_answer_text_and_sft_pairs(tmp_path):
    files = task_files(TASKS["sorting"], {"length": 5, "max_value": 9}, 1, {"train": 50, "validation": 10, "test": 500})
    rows = [json.loads(line) for line in files["train.jsonl"].decode().splitlines()]
    text = [json.loads(line) for line in files["pretrain-train.jsonl"].decode().splitlines()]
    sft = [json.loads(line) for line in files["sft-train.jsonl"].decode().splitlines()]
    assert [t["text"] for t in text] == [r["prompt"] + r["answer"] for r in rows]
    assert sft == [{"prompt": r["prompt"], "response": r["answer"]} for r in rows]


@pytest.mark.parametrize("task, given, option", [
    ("addition", {"digits": 0}, "--digits"),
    ("addition", {"length": 3}, "--length"),
    ("sorting", {"max_value": 10}, "--max-value"),
])
def test_out_of_range_or_foreign_options_name_the_flag(task, given, option):
    with pytest.raises(TaskOptionError) as err:
        resolve_options(TASKS[task], given)
    assert err.value.option == option


def test_more_rows_than_distinct_prompts_is_refused_before_drawing():
    with pytest.raises(TaskOptionError, match="distinct prompts"):
        make_splits(TASKS["addition"], {"digits": 1}, 0, {"test": 60, "validation": 0, "train": 0})


def test_cli_refuses_few_test_rows_unknown_task_and_too_many_rows(tmp_path):
    for args, key in ((["--test", "499"], "--test"), (["--digits", "1", "--train", "100"], "--train")):
        res = run("task", "make", "addition", "--out", str(tmp_path / "x"), "--json", *args)
        assert res.exit_code == 2, res.output
        issue = json.loads(res.stdout)["issues"][0]
        assert issue["key"] == key and issue["hint"]
    res = run("task", "make", "division", "--out", str(tmp_path / "x"), "--json")
    assert res.exit_code == 2 and json.loads(res.stdout)["issues"][0]["key"] == "NAME"
    assert not (tmp_path / "x").exists()


def test_existing_files_are_never_overwritten_without_force(tmp_path):
    out = tmp_path / "task"
    out.mkdir()
    mine = out / "test.jsonl"
    mine.write_text("my own notes\n")
    res = run("task", "make", "--out", str(out), "--train", "100", "--json")
    assert res.exit_code == 2
    issues = json.loads(res.stdout)["issues"]
    assert [i["value"] for i in issues] == [str(mine)] and "--force" in issues[0]["hint"]
    assert mine.read_text() == "my own notes\n" and sorted(os.listdir(out)) == ["test.jsonl"]
    # --force replaces only what a previous `task make` wrote: this file is not in a task.json
    res = run("task", "make", "--out", str(out), "--train", "100", "--force", "--json")
    assert res.exit_code == 2 and "not listed" in json.loads(res.stdout)["issues"][0]["message"]
    assert mine.read_text() == "my own notes\n"


def test_force_replaces_a_previous_run_and_links_are_never_written_through(tmp_path):
    out = tmp_path / "task"
    assert run("task", "make", "--out", str(out), "--train", "100").exit_code == 0
    before = (out / "train.jsonl").read_bytes()
    res = run("task", "make", "--out", str(out), "--train", "200", "--force")
    assert res.exit_code == 0, res.output
    assert (out / "train.jsonl").read_bytes() != before
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (out / "test.jsonl").unlink()
    (out / "test.jsonl").symlink_to(victim)
    res = run("task", "make", "--out", str(out), "--train", "100", "--force", "--json")
    assert res.exit_code == 2 and "symbolic link" in json.loads(res.stdout)["issues"][0]["message"]
    assert victim.read_text() == "keep\n"
