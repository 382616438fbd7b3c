"""A ``--prompts`` or ``--choices`` file with several bad lines names each of them in one run (up
to ``MAX_LINE_ISSUES``, the last then saying the file was not read further), each with its file,
line and a fix; a file-level problem (missing, too large) is still one issue."""

from __future__ import annotations

import json

import pytest

from dlmspec.cli.generate_inputs import MAX_LINE_ISSUES, read_choices, read_prompts
from dlmspec.errors import SpecError


def _lines(issues):
    return [(i.key, i.line) for i in issues]


def test_every_bad_prompt_line_is_named(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": ""}\nnot json\n\n{"prompt_ids": [-1]}\n{"prompt": "fine"}\n')
    with pytest.raises(SpecError) as info:
        read_prompts([], str(path))
    issues = info.value.issues
    assert _lines(issues) == [("--prompts", 2), ("--prompts", 3), ("--prompts", 5)]
    assert "is not JSON" in issues[1].message and "neither a non-empty" in issues[2].message
    assert all(i.file == str(path) and i.hint for i in issues)


def test_every_bad_choice_line_is_named(tmp_path):
    path = tmp_path / "choices.jsonl"
    rows = [{"context": "a", "choices": [" b", " c"], "label": 0},
            {"context": "a", "choices": [" b"], "label": 0},
            {"context": "a", "choices": [" b", " c"], "label": 7}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{oops\n")
    with pytest.raises(SpecError) as info:
        read_choices(str(path))
    issues = info.value.issues
    assert _lines(issues) == [("--choices", 2), ("--choices", 3), ("--choices", 4)]
    assert '"label" = 7' in issues[1].message and "is not JSON" in issues[2].message


def test_reporting_stops_after_the_cap_and_says_so(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": 1}\n' * (MAX_LINE_ISSUES + 30))
    with pytest.raises(SpecError) as info:
        read_prompts([], str(path))
    issues = info.value.issues
    assert [i.line for i in issues] == list(range(1, MAX_LINE_ISSUES + 1))
    assert "was not read further" in issues[-1].message and "was not read further" not in issues[0].message


def test_good_files_read_as_before(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "Once"}\n\n{"prompt_ids": [1, 2]}\n')
    assert read_prompts([], str(path)) == [{"prompt": "Once"}, {"prompt_ids": [1, 2]}]
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(SpecError) as info:
        read_choices(str(missing))
    assert len(info.value.issues) == 1 and "does not exist" in info.value.issues[0].message
