"""The dataset record (dlmspec/data/record.py): round trip, refusals, and file mode."""

from __future__ import annotations

import json
import os
import stat

import pytest

from dlmspec.data.record import RecordError, read_record, record_path, tokenizer_section, write_record


def test_round_trip_and_sorted_bytes(tmp_path):
    prefix = str(tmp_path / "x_text_document")
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{}")
    tok = tokenizer_section("GPT2BPETokenizer", vocab_size=50257, eod_id=50256,
                            files={"vocab_file": str(vocab), "merge_file": None})
    path = write_record(prefix, tokenizer=tok, documents=3, tokens=10)
    assert path == record_path(prefix) == prefix + ".dlmspec.json"
    body = read_record(prefix)
    assert body["documents"] == 3 and body["tokenizer"]["files"]["vocab_file"]["sha256"] == (
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a")  # sha256 of "{}"
    assert "merge_file" not in body["tokenizer"]["files"]
    first = open(path, "rb").read()
    write_record(prefix, tokens=10, documents=3, tokenizer=tok)
    assert open(path, "rb").read() == first


def test_record_is_readable_like_the_dataset(tmp_path):
    old = os.umask(0o022)
    try:
        path = write_record(str(tmp_path / "d"), documents=1)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_missing_is_none_and_bad_ones_are_refused(tmp_path):
    prefix = str(tmp_path / "d")
    assert read_record(prefix) is None
    open(record_path(prefix), "w").write("not json")
    with pytest.raises(RecordError, match="not valid JSON"):
        read_record(prefix)
    open(record_path(prefix), "w").write(json.dumps({"schema": "other", "version": 1}))
    with pytest.raises(RecordError, match="not a dataset record"):
        read_record(prefix)
    open(record_path(prefix), "w").write(json.dumps({"schema": "dlmspec.dataset", "version": 99}))
    with pytest.raises(RecordError, match="version 99"):
        read_record(prefix)
