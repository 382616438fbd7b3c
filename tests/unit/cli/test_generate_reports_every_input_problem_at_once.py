"""`dlmspec generate` reports, in one pass and before any model loads, every flag value no model takes
(checked against the [generate] table's types and ranges), a bad prompts file, a bad batch size and a
run that does not exist: exit 2, each on the command line with a value that works."""

from __future__ import annotations

import json

from dlmspec.cli import main


def _issues(capsys, *args: str) -> tuple[int, list[dict]]:
    capsys.readouterr()
    code = main(["generate", *args, "--json"])
    env = json.loads(capsys.readouterr().out)
    return code, env["issues"]


def test_bad_flags_a_bad_batch_size_and_a_missing_run_come_together(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, issues = _issues(capsys, "runs/none", "--prompt", "hi", "--remasking", "lowconf", "--temperature", "-1",
                           "--cache", "full", "--batch-size", "0")
    assert code == 2
    by_key = {i["key"]: i for i in issues}
    assert set(by_key) == {"--remasking", "--temperature", "--cache", "--batch-size", "RUN_OR_CHECKPOINT"}
    assert "low_confidence" in by_key["--remasking"]["hint"] and "none" in by_key["--cache"]["hint"]
    assert "--temperature 0.0" in by_key["--temperature"]["hint"] and "must be >= 0" in by_key["--temperature"]["message"]
    assert by_key["RUN_OR_CHECKPOINT"]["message"] == "does not exist"


def test_a_missing_prompts_file_and_a_missing_run_come_together(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, issues = _issues(capsys, "runs/none", "--prompts", "no.jsonl")
    assert code == 2
    assert {i["key"] for i in issues} == {"--prompts", "RUN_OR_CHECKPOINT"}


def test_values_a_model_may_take_are_left_to_the_model(tmp_path, capsys, monkeypatch):
    """A block length that does not divide the default gen_length may suit the run's own [generate]
    table: only the missing run is reported."""
    monkeypatch.chdir(tmp_path)
    code, issues = _issues(capsys, "runs/none", "--prompt", "hi", "--block-length", "48")
    assert code == 2
    assert [i["key"] for i in issues] == ["RUN_OR_CHECKPOINT"]
