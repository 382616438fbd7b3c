"""`dlmspec data prepare` checks the token ids of a chunk of lines at once, and still names the
line a check of each document on its own names: the first document in input order (then in
--json-keys order) with an id outside the vocabulary, with its lowest id when it is negative, else
its highest, also when a later line of the chunk is bad JSON, and also past the first chunk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlmspec.data.errors import DataPrepareError
from dlmspec.data.prepare import prepare

#: NullTokenizer: a text of space-separated integers is those ids; --vocab-size 10 (EOD 10).
NULL = {"tokenizer_type": "NullTokenizer", "vocab_size": 10}


def _corpus(tmp_path: Path, rows: list) -> Path:
    path = tmp_path / "ids.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_an_earlier_bad_id_is_named_before_a_later_line_of_bad_json(tmp_path, workers):
    path = _corpus(tmp_path, [{"a": "1 2", "b": "3"}, {"a": "4", "b": "5 12 6"}, "{not json"])
    with pytest.raises(DataPrepareError, match=r"ids.jsonl:2: key 'b': token id 12 is outside the vocabulary"):
        prepare(path, tmp_path / "out", json_keys="a,b", workers=workers, **NULL)
    assert list(tmp_path.glob("out*")) == []


def test_the_first_line_wins_over_the_first_key_and_a_negative_id_is_named(tmp_path):
    path = _corpus(tmp_path, [{"a": "1", "b": "15 -1 2"}, {"a": "13", "b": "1"}])
    with pytest.raises(DataPrepareError, match=r"ids.jsonl:1: key 'b': token id -1 is outside"):
        prepare(path, tmp_path / "out", json_keys="a,b", **NULL)


def test_a_bad_id_past_the_first_chunk_names_its_own_line(tmp_path):
    rows = [{"text": "1 2 3"}] * 40
    rows[34] = {"text": ["4", "7 11 2"]}  # a list of two sentences
    with pytest.raises(DataPrepareError, match=r"ids.jsonl:35: key 'text': token id 11 is outside"):
        prepare(_corpus(tmp_path, rows), tmp_path / "out", append_eod=True, **NULL)


def test_a_line_that_fails_half_way_leaves_its_earlier_keys_checked(tmp_path):
    """Key a of line 2 has a bad id, key b is missing: the bad id comes first, as key a is read first."""
    path = _corpus(tmp_path, [{"a": "1", "b": "2"}, {"a": "12"}])
    with pytest.raises(DataPrepareError, match=r"ids.jsonl:2: key 'a': token id 12 is outside"):
        prepare(path, tmp_path / "out", json_keys="a,b", **NULL)
    path = _corpus(tmp_path, [{"a": "1", "b": "2"}, {"a": "3"}])
    with pytest.raises(DataPrepareError, match=r"ids.jsonl:2: missing key 'b'"):
        prepare(path, tmp_path / "out", json_keys="a,b", **NULL)
