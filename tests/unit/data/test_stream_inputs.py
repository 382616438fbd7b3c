"""`dlmspec data prepare --input` at real scale: several files, a folder, a glob, `.jsonl.gz` and
`.jsonl.zst`, read as one stream in a sorted, deterministic order; the record lists every input.

The reference is the same documents in one plain `.jsonl` file: the outputs must be the same bytes.
"""

from __future__ import annotations

import builtins
import gzip
import json
from pathlib import Path

import pytest
import zstandard
from typer.testing import CliRunner

from dlmspec.data.cli import app
from dlmspec.data.read import read_chunks, resolve_inputs
from dlmspec.data.record import read_record
from shared_kit import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

SHARED = SHARED_DATA
CORPUS = SHARED / "corpus" / "pydocs-train.jsonl"
GPT2 = SHARED / "tokenizers" / "gpt2"
GPT2_CLI = ["--tokenizer-type", "gpt2bpe", "--vocab-file", str(GPT2 / "vocab.json"),
            "--merge-file", str(GPT2 / "merges.txt")]
NULL_CLI = ["--tokenizer-type", "null", "--vocab-size", "100"]


def _invoke(*args: str, sft: bool = False):
    return CliRunner().invoke(app, ["prepare", "--no-progress", *(["--sft"] if sft else []), *args])


def _lines(start: int, n: int) -> list[bytes]:
    return [json.dumps({"text": f"{i % 97} {i % 13} {i % 7}", "title": f"{i % 5}"}).encode() + b"\n"
            for i in range(start, start + n)]


def _write(path: Path, lines: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"".join(lines)
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def _dataset_bytes(prefix: Path, key: str = "text") -> tuple[bytes, bytes]:
    base = f"{prefix}_{key}_document"
    return Path(base + ".bin").read_bytes(), Path(base + ".idx").read_bytes()


@pytest.fixture()
def shards(tmp_path):
    """Four input files in a folder (a plain, a gzip, a zstd one; a subfolder), and the same
    documents in sorted-path order in one plain file."""
    parts = {"d/a.jsonl": _lines(0, 30), "d/b.jsonl.gz": _lines(30, 25), "d/c.jsonl.zst": _lines(55, 40),
             "d/sub/e.jsonl": _lines(95, 5)}
    for name, lines in parts.items():
        _write(tmp_path / name, lines)
    (tmp_path / "d" / "notes.txt").write_text("not an input\n")
    whole = _write(tmp_path / "whole.jsonl", [l for name in sorted(parts) for l in parts[name]])
    return tmp_path / "d", whole


def test_folder_glob_and_repeated_inputs_equal_one_file(shards, tmp_path):
    folder, whole = shards
    assert _invoke("--input", str(whole), "--output-prefix", str(tmp_path / "ref"), *NULL_CLI).exit_code == 0
    want = _dataset_bytes(tmp_path / "ref")
    # a folder; the files named one by one (out of order on the command line: each value keeps its
    # place, so they are given in the folder's order here); a quoted glob with ** (dlmspec expands it)
    runs = {
        "folder": ["--input", str(folder)],
        "repeated": ["--input", str(folder / "a.jsonl"), "--input", str(folder / "b.jsonl.gz"),
                     "--input", str(folder / "c.jsonl.zst"), "--input", str(folder / "sub" / "e.jsonl")],
        "glob": ["--input", str(folder / "**" / "*.jsonl*")],
    }
    for name, args in runs.items():
        result = _invoke(*args, "--output-prefix", str(tmp_path / name), *NULL_CLI, "--json")
        assert result.exit_code == 0, (name, result.output)
        assert _dataset_bytes(tmp_path / name) == want, name
        summary = json.loads(result.stdout)["result"]
        assert summary["documents"] == 100
        assert [Path(i["path"]).name for i in summary["inputs"]] == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst",
                                                                      "e.jsonl"]


def test_record_lists_every_input_with_size_and_mtime(shards, tmp_path):
    folder, _ = shards
    assert _invoke("--input", str(folder), "--output-prefix", str(tmp_path / "o"), *NULL_CLI).exit_code == 0
    record = read_record(f"{tmp_path / 'o'}_text_document")
    inputs = record["inputs"]
    assert [Path(i["path"]).name for i in inputs] == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "e.jsonl"]
    for entry in inputs:
        path = Path(entry["path"])
        assert path.is_absolute()
        assert entry["bytes"] == path.stat().st_size
        assert entry["mtime_ns"] == path.stat().st_mtime_ns
        assert entry["mtime"].endswith("Z")


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_compressed_input_with_json_keys_and_gpt2(suffix, tmp_path):
    with CORPUS.open("rb") as src:
        lines = [next(src) for _ in range(12)]
    rows = [json.dumps({"body": json.loads(l)["text"], "head": json.loads(l)["text"][:40]}).encode() + b"\n"
            for l in lines]
    plain = _write(tmp_path / "plain.jsonl", rows)
    packed = _write(tmp_path / f"packed{suffix}", rows)
    for name, path in (("p", plain), ("c", packed)):
        result = _invoke("--input", str(path), "--output-prefix", str(tmp_path / name), *GPT2_CLI,
                         "--json-keys", "body,head", "--append-eod")
        assert result.exit_code == 0, result.output
    for key in ("body", "head"):
        assert _dataset_bytes(tmp_path / "c", key) == _dataset_bytes(tmp_path / "p", key)


def test_sft_reads_a_compressed_input(tmp_path):
    rows = [json.dumps({"prompt": f"question {i}?", "response": f"answer {i}."}).encode() + b"\n" for i in range(6)]
    plain = _write(tmp_path / "chats.jsonl", rows)
    packed = _write(tmp_path / "chats.jsonl.zst", rows)
    for name, path in (("p", plain), ("c", packed)):
        result = _invoke("--input", str(path), "--output-prefix", str(tmp_path / name), *GPT2_CLI,
                         "--seq-length", "64", sft=True)
        assert result.exit_code == 0, result.output
    assert _dataset_bytes(tmp_path / "c") == _dataset_bytes(tmp_path / "p")


def test_sft_refuses_several_inputs_naming_the_flag(shards, tmp_path):
    folder, _ = shards
    result = _invoke("--input", str(folder), "--output-prefix", str(tmp_path / "o"), *GPT2_CLI, sft=True)
    assert result.exit_code == 2
    assert "--sft" in result.output and "--input" in result.output and "one" in result.output


def test_bad_line_in_a_later_file_names_that_file_and_line(tmp_path):
    _write(tmp_path / "d" / "a.jsonl", _lines(0, 3))
    _write(tmp_path / "d" / "b.jsonl.gz", _lines(3, 2) + [b"{not json\n"])
    result = _invoke("--input", str(tmp_path / "d"), "--output-prefix", str(tmp_path / "o"), *NULL_CLI)
    assert result.exit_code == 2
    assert f"{tmp_path / 'd' / 'b.jsonl.gz'}:3: invalid JSON" in " ".join(result.output.split())
    assert not list(tmp_path.glob("o_*"))


def _error(tmp_path: Path, *args: str) -> str:
    result = _invoke(*args, "--output-prefix", str(tmp_path / "o"), *NULL_CLI)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


def test_input_errors_name_the_value_and_a_remedy(shards, tmp_path):
    folder, whole = shards
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("x")
    text = _error(tmp_path, "--input", str(empty))
    assert f"--input {empty}: the folder has no input files" in text and ".jsonl.zst" in text
    text = _error(tmp_path, "--input", str(tmp_path / "nope" / "*.jsonl"))
    assert "the glob matches no file" in text and "quote" in text
    text = _error(tmp_path, "--input", str(folder), "--input", str(folder / "a.jsonl"))
    assert "read twice" in text and "a.jsonl" in text
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(b"".join(_lines(0, 200)))[:-40])
    text = _error(tmp_path, "--input", str(broken))
    assert f"--input {broken}: cannot read it" in text and "gzip -t" in text


def test_missing_zstandard_says_what_to_install(shards, tmp_path, monkeypatch):
    folder, _ = shards
    real_import = builtins.__import__

    def no_zstd(name, *args, **kwargs):
        if name == "zstandard":
            raise ImportError("No module named 'zstandard'", name="zstandard")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_zstd)
    text = _error(tmp_path, "--input", str(folder / "c.jsonl.zst"))
    assert "pip install zstandard" in text and "c.jsonl.zst" in text


def test_reader_streams_and_resumes_after_a_line(shards):
    folder, _ = shards
    files = [f.path for f in resolve_inputs([str(folder)])]
    chunks = list(read_chunks(files, 7, 1 << 20))
    assert {c.source for c in chunks} == set(files)  # a chunk never spans two files
    assert all(len(c.lines) <= 7 for c in chunks)
    docs = [(c.file_index, n) for c in chunks for n, _ in c.lines]
    assert len(docs) == 100
    later = [(c.file_index, n) for c in read_chunks(files, 7, 1 << 20, start_after=(1, 10)) for n, _ in c.lines]
    assert later == docs[30 + 10:]


def test_a_truncated_zst_file_is_an_error_not_a_short_dataset(tmp_path):
    whole = zstandard.ZstdCompressor().compress(b"".join(_lines(0, 3000)))
    for name, data in (("half.jsonl.zst", whole[: len(whole) // 2]), ("tail.jsonl.zst", whole[:-30])):
        broken = tmp_path / name
        broken.write_bytes(data)
        text = _error(tmp_path, "--input", str(broken))
        assert f"--input {broken}: cannot read it" in text and "zstd -t" in text, text
    # several frames (zstd a b > ab.zst, or pzstd) are read whole
    frames = tmp_path / "frames.jsonl.zst"
    frames.write_bytes(zstandard.ZstdCompressor().compress(b"".join(_lines(0, 10)))
                       + zstandard.ZstdCompressor().compress(b"".join(_lines(10, 5))))
    result = _invoke("--input", str(frames), "--output-prefix", str(tmp_path / "f"), *NULL_CLI, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["result"]["documents"] == 15
