"""A tokenizer file is parsed once per process while unchanged, and read again once it changes."""

from __future__ import annotations

import json
import os

from dlmspec import tokenizers


def test_an_unchanged_tokenizer_file_is_parsed_once_and_a_changed_one_again(tmp_path, monkeypatch):
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps({"a": 0, "<|endoftext|>": 1}))
    calls = []
    import dlmspec.files as files

    real = files.read_json
    monkeypatch.setattr(files, "read_json", lambda *a, **k: calls.append(a) or real(*a, **k))
    first = tokenizers.read_json(str(path))
    assert tokenizers.read_json(str(path)) == first == {"a": 0, "<|endoftext|>": 1}
    assert len(calls) == 1
    path.write_text(json.dumps({"b": 0, "<|endoftext|>": 7, "c": 2}))
    os.utime(path, ns=(1, 1))  # a different mtime whatever the clock's resolution
    assert tokenizers.read_json(str(path)) == {"b": 0, "<|endoftext|>": 7, "c": 2}
    assert len(calls) == 2
