"""validate and compile read the dataset records and manifests a spec's data.train names
through dlmspec.files: a record or manifest that is a FIFO, a link to /dev/zero, or
100,000 nested brackets is an error naming the file (exit 2), never a hang, a RecursionError or a
traceback."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest


from blend_shards import docs_of, null_tokenizer, write_shard  # noqa: E402

from dlmspec.cli import main  # noqa: E402
from spec_kit import spec_file

#: What the spec changes in spec_kit.DEFAULT: data from files (each test names its data.train).
FILES = {
    "data": {"tokenizer": {"type": "NullTokenizer", "vocab_size": 999}, "train": ["data/web-00000_text_document"]},
    "logging": {"tensorboard_dir": "runs/t/tensorboard"},
}


def _hostile(path: Path, kind: str) -> threading.Timer | None:
    """Make ``path`` a FIFO, a link to /dev/zero or 100,000 nested brackets; for a FIFO, a timer
    that opens its write end after 3 s, so a reader that blocks fails the test instead of hanging."""
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "nested":
        path.write_text("[" * 100_000 + "]" * 100_000)
        return None
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
        return None
    os.mkfifo(path)

    def release() -> None:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    timer = threading.Timer(3.0, release)
    timer.start()
    return timer


def _run(args: list[str], capsys) -> tuple[int, str]:
    code = main(args)
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    write_shard(str(tmp_path / "data" / "web-00000_text_document"), docs_of(10), null_tokenizer())
    return tmp_path


KINDS = ["fifo", "dev-zero", "nested"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["validate", "compile"])
def test_a_dataset_record_that_is_not_one_is_an_error_naming_it(data: Path, capsys, kind: str, command: str) -> None:
    record = data / "data" / "web-00000_text_document.dlmspec.json"
    timer = _hostile(record, kind)
    args = [command, str(spec_file(data, FILES, {"data.train": ["data/web-00000_text_document"]}))]
    if command == "compile":
        args += ["--output", str(data / "out")]
    try:
        code, text = _run(args, capsys)
    finally:
        if timer is not None:
            timer.cancel()
    assert code == 2, text
    assert "dlmspec.json" in text and "Traceback" not in text and "RecursionError" not in text
    assert "cannot be read" in text


@pytest.mark.parametrize("kind", KINDS)
def test_a_manifest_that_is_not_one_is_an_error_naming_it(data: Path, capsys, kind: str) -> None:
    manifest = data / "data" / "web_text_document.manifest.json"
    timer = _hostile(manifest, kind)
    try:
        code, text = _run(["validate", str(spec_file(data, FILES, {"data.train": ["data/web_text_document.manifest.json"]}))], capsys)
    finally:
        if timer is not None:
            timer.cancel()
    assert code == 2 and "data-manifest-unreadable" in text, text
    assert "Traceback" not in text and "RecursionError" not in text


def test_an_index_with_a_negative_length_is_an_error_naming_it(data: Path, capsys) -> None:
    import struct

    lengths, pointers = [10, -20, 30], [0, 20, 20]
    idx = (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 3, 4) + struct.pack("<3i", *lengths)
           + struct.pack("<3q", *pointers) + struct.pack("<4q", 0, 1, 2, 3))
    (data / "data" / "web-00000_text_document.idx").write_bytes(idx)
    code, text = _run(["validate", str(spec_file(data, FILES, {"data.train": ["data/web-*_text_document"]}))], capsys)
    assert code == 2 and "data-index-unreadable" in text and "negative sequence length" in text, text
