"""`dlmspec data prepare --resume` with a progress file that is not what an interrupted run wrote
(wrong types, missing keys, negative or huge offsets, deep nesting, a FIFO, /dev/zero, bytes that
are not UTF-8, a line past the input's end, another input list): exit 2 naming the file, the key,
the value and the fix, and the complete shards are left as they were."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.data.cli import app

NULL_CLI = ["--tokenizer-type", "null", "--vocab-size", "100"]
N_DOCS = 60


def _invoke(*args: str):
    return CliRunner().invoke(app, ["prepare", "--no-progress", *args])


def _args(corpus: Path, prefix: Path, *extra: str) -> list[str]:
    return ["--input", str(corpus), "--output-prefix", str(prefix), *NULL_CLI, "--json-keys", "text",
            "--shard-size", "40", *extra]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path, dict]:
    """A sharded run whose progress file is marked unfinished: a base to tamper with."""
    folder = tmp_path_factory.mktemp("resume")
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(str(j) for j in range(i % 7 + 1))}) + "\n"
                              for i in range(N_DOCS)))
    result = _invoke(*_args(corpus, folder / "out" / "ds"))
    assert result.exit_code == 0, result.output
    progress = json.loads((folder / "out" / "ds.prepare-progress.json").read_text())
    assert len(progress["shards"]) >= 2
    progress["complete"] = False
    return corpus, folder / "out", progress


def _tampered(progress: dict, path: tuple, value) -> dict:
    body = json.loads(json.dumps(progress))
    node = body
    for part in path[:-1]:
        node = node[part]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return body


_DELETE = object()

#: (name, path in the progress file, the value put there, a word the message must hold)
FIELD_CASES = [
    ("kind", ("kind",), "other", "'kind'"),
    ("version_string", ("version",), "1", "'version'"),
    ("complete_string", ("complete",), "no", "'complete'"),
    ("no_arguments", ("arguments",), _DELETE, "'arguments'"),
    ("inputs_string", ("arguments", "inputs"), "corpus.jsonl", "'arguments.inputs'"),
    ("input_number", ("arguments", "inputs", 0), 5, "'arguments.inputs[0]'"),
    ("input_negative_bytes", ("arguments", "inputs", 0, "bytes"), -1, "'arguments.inputs[0].bytes'"),
    ("tokenizer_files_strings", ("arguments", "tokenizer", "files"), {"vocab_file": "x"}, "'arguments.tokenizer.files'"),
    ("json_keys_string", ("arguments", "json_keys"), "text", "'arguments.json_keys'"),
    ("shard_size_float", ("arguments", "shard_size"), 40.5, "'arguments.shard_size'"),
    ("shards_object", ("shards",), {}, "'shards'"),
    ("shard_string", ("shards", 0), "x", "'shards[0]'"),
    ("shard_index", ("shards", 1, "index"), 7, "'shards[1].index'"),
    ("end_negative", ("shards", 0, "end"), [0, -5], "'shards[0].end[1]'"),
    ("end_huge", ("shards", 0, "end"), [0, 10**30], "'shards[0].end[1]'"),
    ("end_other_file", ("shards", 0, "end"), [3, 1], "'shards[0].end[0]'"),
    ("end_nested", ("shards", 0, "end"), [[0], [1]], "'shards[0].end[0]'"),
    ("end_backwards", ("shards", 1, "end"), [0, 0], "'shards[1].end'"),
    ("no_keys", ("shards", 0, "keys"), _DELETE, "'shards[0].keys'"),
    ("counts_null", ("shards", 0, "keys", "text"), None, "'shards[0].keys.text'"),
    ("bin_bytes_string", ("shards", 0, "keys", "text", "bin_bytes"), "12", "'shards[0].keys.text.bin_bytes'"),
    ("tokens_boolean", ("shards", 0, "keys", "text", "tokens"), True, "'shards[0].keys.text.tokens'"),
    ("documents_huge", ("shards", 0, "keys", "text", "documents"), 2**64, "'shards[0].keys.text.documents'"),
]


def _check_refused(result, progress_file: Path, *needles: str) -> None:
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert str(progress_file) in text and "--force" in text, text
    for needle in needles:
        assert needle in text, (needle, text)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name.startswith("ds-")}


@pytest.mark.parametrize("name,path,value,needle", FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_resume_refuses_a_progress_file_field_naming_key_and_remedy(finished, tmp_path, name, path, value, needle):
    corpus, out, progress = finished
    work = tmp_path / "out"
    work.mkdir()
    for item in out.iterdir():
        (work / item.name).write_bytes(item.read_bytes())
    progress_file = work / "ds.prepare-progress.json"
    progress_file.write_text(json.dumps(_tampered(progress, path, value)))
    before = _snapshot(work)
    result = _invoke(*_args(corpus, work / "ds", "--resume"))
    _check_refused(result, progress_file, needle)
    assert _snapshot(work) == before


def _copy(out: Path, tmp_path: Path) -> Path:
    work = tmp_path / "out"
    work.mkdir()
    for item in out.iterdir():
        (work / item.name).write_bytes(item.read_bytes())
    return work


@pytest.mark.parametrize("kind", ["list", "null", "deep", "not_utf8", "fifo", "dev_zero", "folder", "empty"])
def test_resume_refuses_a_progress_file_that_is_not_one(finished, tmp_path, kind):
    corpus, out, _ = finished
    work = _copy(out, tmp_path)
    progress_file = work / "ds.prepare-progress.json"
    progress_file.unlink()
    if kind == "fifo":
        os.mkfifo(progress_file)
    elif kind == "dev_zero":
        progress_file.symlink_to("/dev/zero")
    elif kind == "folder":
        progress_file.mkdir()
    else:
        progress_file.write_bytes({"list": b"[]", "null": b"null", "deep": b"[" * 200_000 + b"]" * 200_000,
                                   "not_utf8": b'{"kind": "\xff\xfe"}', "empty": b""}[kind])
    before = _snapshot(work)
    result = _invoke(*_args(corpus, work / "ds", "--resume"))
    _check_refused(result, progress_file)
    assert _snapshot(work) == before


def test_resume_refuses_a_shard_end_past_the_input(finished, tmp_path):
    corpus, out, progress = finished
    work = _copy(out, tmp_path)
    progress_file = work / "ds.prepare-progress.json"
    last = len(progress["shards"]) - 1
    progress_file.write_text(json.dumps(_tampered(progress, ("shards", last, "end"), [0, 10**6])))
    before = _snapshot(work)
    result = _invoke(*_args(corpus, work / "ds", "--resume"))
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), text
    assert "line 1,000,000" in text and str(corpus) in text and "--force" in text, text
    assert _snapshot(work) == before


def test_resume_refuses_another_input_list(finished, tmp_path):
    corpus, out, progress = finished
    work = _copy(out, tmp_path)
    progress_file = work / "ds.prepare-progress.json"
    other = dict(progress["arguments"]["inputs"][0], path=str(tmp_path / "other.jsonl"))
    progress_file.write_text(json.dumps(_tampered(progress, ("arguments", "inputs"),
                                                  [progress["arguments"]["inputs"][0], other])))
    result = _invoke(*_args(corpus, work / "ds", "--resume"))
    _check_refused(result, progress_file, "other.jsonl")


def test_resume_of_an_untampered_progress_file_finishes(finished, tmp_path):
    corpus, out, progress = finished
    work = _copy(out, tmp_path)
    (work / "ds.prepare-progress.json").write_text(json.dumps(progress))
    result = _invoke(*_args(corpus, work / "ds", "--resume", "--json"))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["result"]["documents"] == N_DOCS
