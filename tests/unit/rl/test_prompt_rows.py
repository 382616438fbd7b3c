"""The RL prompt file: good rows read with their extra fields; each kind of malformed row an error
naming the file and line, or skipped and counted; problems with the file itself always errors."""

from __future__ import annotations

import json
import os

import pytest

from dlmspec.backends.rl.prompts import PromptFileError, read_prompts
from dlmspec.files import FileRefused


def _write(tmp_path, lines, name="prompts.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return path


GOOD = [json.dumps({"prompt": "What is 2 + 3?", "answer": "5", "level": 1}),
        "",
        json.dumps({"prompt": "6 * 7?", "answer": 42, "prompt_id": "gsm-7"})]


def test_good_rows_keep_extra_fields_and_get_prompt_ids(tmp_path):
    rows, skipped = read_prompts(_write(tmp_path, GOOD))
    assert skipped == 0
    assert rows == [{"prompt": "What is 2 + 3?", "answer": "5", "level": 1, "prompt_id": "prompts.jsonl:1"},
                    {"prompt": "6 * 7?", "answer": "42", "prompt_id": "gsm-7"}]


BAD_ROWS = [
    ("{not json", "line 2 is not JSON"),
    ('["a list"]', "the row is a JSON list, not an object"),
    ('{"answer": "5"}', "the row has no 'prompt'"),
    ('{"prompt": "", "answer": "5"}', "'prompt' is empty"),
    ('{"prompt": 7, "answer": "5"}', "'prompt' is int, not text"),
    ('{"prompt": "q"}', "the row has no 'answer'"),
    ('{"prompt": "q", "answer": 1.5}', "'answer' is float 1.5, not text"),
    ('{"prompt": "q", "answer": true}', "'answer' is bool"),
    ('{"prompt": "\\ud800", "answer": "5"}', "lone surrogate"),
    ('{"prompt": "q", "answer": "5", "prompt_id": [1]}', "'prompt_id' is list"),
    ('{"prompt": "q", "answer": "5", "prompt_id": "prompts.jsonl:1"}', "'prompt_id' 'prompts.jsonl:1' repeats line 1's"),
    (b'{"prompt": "\xff", "answer": "5"}', "not UTF-8"),
]


@pytest.mark.parametrize("line,why", BAD_ROWS, ids=[w for _, w in BAD_ROWS])
def test_a_malformed_row_is_an_error_naming_file_and_line(tmp_path, line, why):
    path = _write(tmp_path, [GOOD[0], line, GOOD[2]])
    with pytest.raises(PromptFileError) as info:
        read_prompts(path)
    assert info.value.path == str(path) and info.value.line == 2
    assert str(info.value).startswith(f"{path}:2: ") and why in str(info.value) and "Fix: " in str(info.value)
    assert isinstance(info.value, FileRefused)  # the command line's exit code 2


def test_malformed_rows_are_skipped_and_counted_when_asked(tmp_path):
    path = _write(tmp_path, [GOOD[0]] + [line for line, _ in BAD_ROWS] + [GOOD[2]])
    rows, skipped = read_prompts(path, on_error="skip")
    assert [r["prompt_id"] for r in rows] == ["prompts.jsonl:1", "gsm-7"]
    assert skipped == len(BAD_ROWS)


def test_answer_is_optional_when_not_required(tmp_path):
    rows, skipped = read_prompts(_write(tmp_path, ['{"prompt": "write a poem"}']), require_answer=False)
    assert rows == [{"prompt": "write a poem", "prompt_id": "prompts.jsonl:1"}] and skipped == 0


def test_file_problems_are_errors_even_when_skipping(tmp_path):
    with pytest.raises(PromptFileError, match="does not exist"):
        read_prompts(tmp_path / "missing.jsonl", on_error="skip")
    with pytest.raises(PromptFileError, match="not a regular file"):
        read_prompts(tmp_path, on_error="skip")
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(PromptFileError, match="FIFO"):
        read_prompts(fifo)
    with pytest.raises(PromptFileError, match=r"no usable row \(2 skipped\)"):
        read_prompts(_write(tmp_path, ["{bad", "[]"], name="bad.jsonl"), on_error="skip")
    with pytest.raises(PromptFileError, match="no usable row"):
        read_prompts(_write(tmp_path, ["", "  "], name="blank.jsonl"))
    with pytest.raises(ValueError, match="on_error = 'ignore'"):
        read_prompts(tmp_path / "x.jsonl", on_error="ignore")
