"""`dlmspec data prepare --shard-size` and `--resume`: numbered shards, a manifest per key, and an
interrupted run that continues after its last complete shard with the bytes an uninterrupted run
writes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dlmspec.data import outputs
from dlmspec.data import prepare as prepare_module
from dlmspec.data.cli import app
from dlmspec.data.errors import DataPrepareError
from dlmspec.data.record import read_record
from dlmspec.data.shards import parse_shard_size

NULL_CLI = ["--tokenizer-type", "null", "--vocab-size", "100"]
SHARD = "300"
N_DOCS = 200


def _invoke(*args: str):
    return CliRunner().invoke(app, ["prepare", "--no-progress", *args])


def _text(output) -> str:
    return " ".join(output.split())


@pytest.fixture()
def corpus(tmp_path) -> Path:
    path = tmp_path / "in" / "corpus.jsonl"
    path.parent.mkdir()
    with path.open("w") as f:
        for i in range(N_DOCS):
            f.write(json.dumps({"text": " ".join(str((i * j) % 50) for j in range(1 + i % 9)),
                                "title": f"{i % 10} {i % 3}"}) + "\n")
    return path


def _args(corpus: Path, prefix: Path, *extra: str) -> list[str]:
    return ["--input", str(corpus), "--output-prefix", str(prefix), *NULL_CLI, "--json-keys", "text,title",
            "--shard-size", SHARD, *extra]


def _documents(prefix: str) -> list[list[int]]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    data = IndexedDataset(prefix, mmap=True)
    return [data[i].tolist() for i in range(len(data))]


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_parse_shard_size():
    assert parse_shard_size("2e9") == 2_000_000_000
    assert parse_shard_size("500M") == 500_000_000
    assert parse_shard_size("1.5G") == 1_500_000_000
    assert parse_shard_size("100k") == 100_000
    assert parse_shard_size("2_000") == 2000
    assert parse_shard_size(None) is None
    for bad in ("0", "1.5", "abc", "-3", "1e400", "5X", ""):
        with pytest.raises(DataPrepareError, match=r"--shard-size .*500M"):
            parse_shard_size(bad)


def test_shards_and_manifests(corpus, tmp_path):
    result = _invoke(*_args(corpus, tmp_path / "out" / "ds"), "--append-eod", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["result"]
    assert _invoke("--input", str(corpus), "--output-prefix", str(tmp_path / "one" / "ds"), *NULL_CLI,
                   "--json-keys", "text,title", "--append-eod").exit_code == 0
    out = tmp_path / "out"
    per_key = {}
    for key in ("text", "title"):
        manifest = json.loads((out / f"ds_{key}_document.manifest.json").read_text())
        assert manifest["kind"] == "dlmspec-dataset-manifest" and manifest["version"] == 1
        assert manifest["tokenizer"] == read_record(str(tmp_path / "one" / f"ds_{key}_document"))["tokenizer"]
        shards = manifest["shards"]
        assert [s["path"] for s in shards] == [f"ds-{i:05d}_{key}_document" for i in range(len(shards))]
        docs = []
        for entry in shards:
            shard_docs = _documents(str(out / entry["path"]))
            assert entry["documents"] == len(shard_docs)
            assert entry["tokens"] == sum(map(len, shard_docs))
            record = read_record(str(out / entry["path"]))
            assert (record["documents"], record["tokens"]) == (entry["documents"], entry["tokens"])
            docs.append(shard_docs)
        # the shards, one after another, are the unsharded dataset
        assert [d for shard in docs for d in shard] == _documents(str(tmp_path / "one" / f"ds_{key}_document"))
        per_key[key] = docs
    # shard i holds the same documents for both keys; a shard ends at the document that fills it
    assert len(per_key["text"]) == len(summary["shards"]) >= 3
    for i, (text, title) in enumerate(zip(per_key["text"], per_key["title"])):
        assert len(text) == len(title)
        fullest = max(sum(map(len, text)), sum(map(len, title)))
        before = max(sum(map(len, text[:-1])), sum(map(len, title[:-1])))
        if i < len(per_key["text"]) - 1:
            assert fullest >= int(SHARD) > before
        else:
            assert fullest < int(SHARD) or before < int(SHARD)
    assert summary["documents"] == N_DOCS and summary["shard_size"] == int(SHARD)
    progress = json.loads((out / "ds.prepare-progress.json").read_text())
    assert progress["complete"] is True and len(progress["shards"]) == len(summary["shards"])


def _stopping_runtime(monkeypatch, after: int, exc: type[BaseException] = KeyboardInterrupt) -> None:
    """Make the dataset writer raise ``exc`` at its ``after``-th document (any key)."""
    np_, dtype, builder = prepare_module.load_runtime()
    calls = []

    class Stopping(builder):
        def add_document(self, *a, **k):
            calls.append(1)
            if len(calls) == after:
                raise exc()
            return super().add_document(*a, **k)

    monkeypatch.setattr(prepare_module, "load_runtime", lambda: (np_, dtype, Stopping))


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_interrupted_run_keeps_shards_and_resume_writes_the_same_bytes(corpus, tmp_path, monkeypatch):
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert _invoke(*_args(corpus, whole / "ds")).exit_code == 0
    manifest = json.loads((whole / "ds_text_document.manifest.json").read_text())
    first_two = manifest["shards"][0]["documents"] + manifest["shards"][1]["documents"]
    # Ctrl-C in the middle of the third shard (two add_document calls a document: two keys)
    with monkeypatch.context() as patch:
        _stopping_runtime(patch, after=2 * (first_two + 5))
        stopped = _invoke(*_args(corpus, part / "ds"))
    assert stopped.exit_code == 130
    text = _text(stopped.output)
    assert "2 complete shards kept" in text and "--resume" in text
    names = sorted(os.listdir(part))
    assert not [n for n in names if ".tmp-" in n]
    assert "ds_text_document.manifest.json" not in names
    for i in (0, 1):
        for key in ("text", "title"):
            for ext in (".bin", ".idx", ".dlmspec.json"):
                assert f"ds-{i:05d}_{key}_document{ext}" in names
    assert not [n for n in names if n.startswith("ds-00002")]
    assert len(json.loads((part / "ds.prepare-progress.json").read_text())["shards"]) == 2

    # the same command again, without --resume or --force: refused, naming --resume
    again = _invoke(*_args(corpus, part / "ds"))
    assert again.exit_code == 2 and "--resume" in _text(again.output) and "--force" in _text(again.output)

    # a crash (SIGKILL) would have left the third shard's temporary files: --resume removes them
    stale = part / f"ds-00002_text_document.tmp-{outputs.host_tag()}-{_dead_pid()}-0123abcd.bin"
    stale.write_bytes(b"\0" * 64)
    resumed = _invoke(*_args(corpus, part / "ds", "--resume", "--workers", "2", "--json"))
    assert resumed.exit_code == 0, resumed.output
    summary = json.loads(resumed.stdout)["result"]
    assert summary["resumed_shards"] == 2 and summary["documents"] == N_DOCS
    assert any("stale temporary" in n for n in summary["notes"]) and not stale.exists()
    assert _tree(part) == _tree(whole) | {"ds.prepare-progress.json": _tree(part)["ds.prepare-progress.json"]}
    want = json.loads((whole / "ds.prepare-progress.json").read_text())
    assert json.loads((part / "ds.prepare-progress.json").read_text()) == want

    # --resume on a complete run: nothing to do, nothing changed
    before = _tree(part)
    done = _invoke(*_args(corpus, part / "ds", "--resume"))
    assert done.exit_code == 0 and "complete already" in _text(done.output)
    assert _tree(part) == before


def test_a_crash_keeps_complete_shards_too(corpus, tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        _stopping_runtime(patch, after=2 * 150, exc=RuntimeError)
        with pytest.raises(RuntimeError):
            prepare_module.prepare(corpus, tmp_path / "ds", tokenizer_type="null", vocab_size=100,
                                   json_keys="text,title", shard_size=SHARD)
    names = os.listdir(tmp_path)
    assert "ds-00000_text_document.idx" in names and not [n for n in names if ".tmp-" in n]
    result = prepare_module.prepare(corpus, tmp_path / "ds", tokenizer_type="null", vocab_size=100,
                                    json_keys="text,title", shard_size=SHARD, resume=True)
    assert result.resumed_shards >= 1 and result.documents == N_DOCS


def test_resume_refuses_other_arguments_naming_them(corpus, tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        _stopping_runtime(patch, after=300)
        assert _invoke(*_args(corpus, tmp_path / "ds")).exit_code == 130
    cases = {
        "--append-eod": [*_args(corpus, tmp_path / "ds", "--resume", "--append-eod")],
        "--shard-size: 300 then, 301 now": [*_args(corpus, tmp_path / "ds", "--resume")[:-2], "301", "--resume"],
        "--json-keys: text,title then, text now": ["--input", str(corpus), "--output-prefix", str(tmp_path / "ds"),
                                                  *NULL_CLI, "--shard-size", SHARD, "--resume"],
        "--vocab-size": [*_args(corpus, tmp_path / "ds", "--resume")[:6], "--vocab-size", "200",
                         *_args(corpus, tmp_path / "ds", "--resume")[8:]],
    }
    for needle, args in cases.items():
        result = _invoke(*args)
        assert result.exit_code == 2, (needle, result.output)
        assert needle in _text(result.output) and "differ" in _text(result.output), (needle, result.output)
    os.utime(corpus, ns=(0, 0))
    result = _invoke(*_args(corpus, tmp_path / "ds", "--resume"))
    assert result.exit_code == 2 and f"--input {corpus}: changed since the interrupted run" in _text(result.output)
    # a kept shard that changed is not trusted
    os.utime(corpus, ns=(corpus.stat().st_atime_ns, json.loads((tmp_path / "ds.prepare-progress.json")
                                                                .read_text())["arguments"]["inputs"][0]["mtime_ns"]))
    with open(tmp_path / "ds-00000_text_document.bin", "ab") as f:
        f.write(b"\0\0")
    result = _invoke(*_args(corpus, tmp_path / "ds", "--resume"))
    assert result.exit_code == 2 and "ds-00000_text_document.bin, a complete shard" in _text(result.output)
    assert _invoke(*_args(corpus, tmp_path / "ds", "--force")).exit_code == 0


def test_flag_errors(corpus, tmp_path):
    base = ["--input", str(corpus), "--output-prefix", str(tmp_path / "ds"), *NULL_CLI]
    for args, needle in (
        ([*base, "--resume"], "--resume continues a run with --shard-size"),
        ([*base, "--shard-size", "1k", "--resume", "--force"], "--resume and --force: pass one of them"),
        ([*base, "--shard-size", "lots"], "--shard-size lots: not a whole number of tokens"),
        ([*base, "--shard-size", "1k", "--sft"], "--shard-size: not used with --sft"),
    ):
        result = _invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert needle in _text(result.output)
    assert list(tmp_path.glob("ds*")) == []


def test_force_replaces_a_longer_run_and_resume_with_nothing_starts(corpus, tmp_path):
    prefix = tmp_path / "ds"
    fresh = _invoke(*_args(corpus, prefix, "--resume"))
    assert fresh.exit_code == 0 and "nothing to resume" in _text(fresh.output)
    assert len(list(tmp_path.glob("ds-*_text_document.bin"))) >= 3
    args = _args(corpus, prefix, "--force")
    args[args.index("--shard-size") + 1] = "100M"
    assert _invoke(*args).exit_code == 0
    assert sorted(p.name for p in tmp_path.glob("ds-*")) == [
        "ds-00000_text_document.bin", "ds-00000_text_document.dlmspec.json", "ds-00000_text_document.idx",
        "ds-00000_title_document.bin", "ds-00000_title_document.dlmspec.json", "ds-00000_title_document.idx"]


def test_an_input_named_like_a_shard_is_refused(tmp_path):
    corpus = tmp_path / "ds-00000_text_document.bin"
    corpus.write_text(json.dumps({"text": "1 2 3"}) + "\n")
    result = _invoke("--input", str(corpus), "--output-prefix", str(tmp_path / "ds"), *NULL_CLI,
                     "--shard-size", "10", "--force")
    assert result.exit_code == 2 and "never writes over its input" in _text(result.output)
    assert corpus.read_text().startswith("{")


def test_a_failed_run_without_a_complete_shard_leaves_nothing(tmp_path):
    corpus = tmp_path / "in.jsonl"
    corpus.write_text(json.dumps({"text": "1 2 3"}) + "\n" + "{not json\n")
    result = _invoke("--input", str(corpus), "--output-prefix", str(tmp_path / "out" / "ds"), *NULL_CLI,
                     "--shard-size", "1k")
    assert result.exit_code == 2 and "invalid JSON" in _text(result.output)
    assert os.listdir(tmp_path / "out") == []
