"""``dlmspec data inspect`` of a dataset whose files hold hostile text: a lone surrogate
(JSON's ``"\\ud800"``), terminal escapes or a token-shaped secret in the record, escapes in the
dataset's file name or a manifest's shard path; and a ``.bin`` far larger than the memory the
process may map. Each prints escaped, redacted text or exits 2 naming the file; never a
traceback, never a raw escape, never the secret."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import tokenizer_kit as kit
from dlmspec.data.prepare import prepare

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

GPT2 = Path(kit.CORPUS).parents[1] / "tokenizers" / "gpt2"
GPT2_ARGS = {"tokenizer_type": "GPT2BPETokenizer", "vocab_file": str(GPT2 / "vocab.json"),
             "merge_file": str(GPT2 / "merges.txt")}
ESCAPES = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mRED"
HF_TOKEN = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI"


def _dataset(root: Path, **kwargs) -> str:
    source = kit.write_jsonl(root / "docs.jsonl", kit.corpus_texts(6))
    result = prepare(source, root / "d", append_eod=True, **GPT2_ARGS, **kwargs)
    return result.datasets[0].prefix


def _inspect(*args: str, cwd: Path, address_space: int | None = None) -> subprocess.CompletedProcess[bytes]:
    """``dlmspec data inspect`` in a process of its own (stdout a UTF-8 pipe), optionally under an
    address-space limit (``RLIMIT_AS``)."""
    def limit() -> None:
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "dlmspec.cli", "data", "inspect", *args], cwd=cwd, env=env,
                          capture_output=True, timeout=120, preexec_fn=limit)


def _edit_record(prefix: str, raw_tokenizer: str) -> None:
    path = Path(prefix + ".dlmspec.json")
    record = json.loads(path.read_text())
    text = json.dumps(record)
    old = json.dumps(record["tokenizer"])
    path.write_text(text.replace(old, raw_tokenizer))


def _no_traceback(done: subprocess.CompletedProcess[bytes]) -> bytes:
    out = done.stdout + done.stderr
    assert b"Traceback" not in out, done.stderr.decode(errors="replace")[-2000:]
    return out


def test_a_lone_surrogate_in_the_record_prints_escaped(tmp_path: Path) -> None:
    prefix = _dataset(tmp_path)
    _edit_record(prefix, '{"type": "GPT2\\ud800", "vocab_size": 50257}')
    done = _inspect(prefix, cwd=tmp_path)
    _no_traceback(done)
    assert done.returncode == 0
    assert b"GPT2\\ud800" in done.stdout


def test_terminal_escapes_in_the_record_print_escaped(tmp_path: Path) -> None:
    prefix = _dataset(tmp_path)
    _edit_record(prefix, json.dumps({"type": ESCAPES + "[bold]x[/bold]", "vocab_size": 50257}))
    done = _inspect(prefix, cwd=tmp_path)
    out = _no_traceback(done)
    assert done.returncode == 0
    assert b"\x1b" not in out and b"\x07" not in out
    assert b"\\x1b]0;PWNED\\x07\\x1b[2J\\x1b[31mRED[bold]x[/bold]" in done.stdout  # markup printed literally


def test_a_secret_in_a_recorded_file_path_is_hidden(tmp_path: Path) -> None:
    prefix = _dataset(tmp_path)
    _edit_record(prefix, json.dumps({"type": "GPT2BPETokenizer", "vocab_size": 50257, "files": {
        "vocab_file": {"path": f"/data/{HF_TOKEN}/vocab.json", "sha256": "0" * 64}}}))
    for args in ((prefix,), (prefix, "--json")):
        done = _inspect(*args, cwd=tmp_path)
        out = _no_traceback(done)
        assert done.returncode == 0
        assert HF_TOKEN.encode() not in out
        assert b"<hidden>" in out


def test_escapes_in_the_dataset_name_print_escaped(tmp_path: Path) -> None:
    prefix = _dataset(tmp_path)
    name = tmp_path / "\x1b]0;PWNED\x07\x1b[2J\x1b[31mds"
    for suffix in (".bin", ".idx", ".dlmspec.json"):
        os.rename(prefix + suffix, str(name) + suffix)
    done = _inspect(name.name, cwd=tmp_path)
    out = _no_traceback(done)
    assert done.returncode == 0
    assert b"\x1b" not in out and b"\x07" not in out
    assert b"\\x1b]0;PWNED" in done.stdout


def test_escapes_in_a_manifest_shard_path_print_escaped(tmp_path: Path) -> None:
    _dataset(tmp_path, shard_size=200)
    manifest = next(tmp_path.glob("*.manifest.json"))
    body = json.loads(manifest.read_text())
    body["shards"][0]["path"] = ESCAPES
    manifest.write_text(json.dumps(body))
    done = _inspect(manifest.name, cwd=tmp_path)
    out = _no_traceback(done)
    assert done.returncode == 2
    assert b"\x1b" not in out and b"\x07" not in out
    assert b"\\x1b]0;PWNED" in done.stderr


def test_a_bin_larger_than_the_address_space_is_not_mapped_whole(tmp_path: Path) -> None:
    prefix = _dataset(tmp_path)
    with open(prefix + ".bin", "r+b") as handle:  # sparse: 8 GiB long, a few KiB on disk
        handle.truncate(8 << 30)
    done = _inspect(prefix, "--no-decode", cwd=tmp_path, address_space=2 << 30)
    _no_traceback(done)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert b"sample: document 0" in done.stdout
