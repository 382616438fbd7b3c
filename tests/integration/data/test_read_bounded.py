"""Reading `data prepare` input in bounded pieces: a small .zst file that expands to one endless
line, a gzip file of a billion blank lines and a plain file with one huge line are read with
little memory and quickly; the line over --max-line-bytes is named (exit 2)."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc
from pathlib import Path

import pytest
import zstandard
from typer.testing import CliRunner

from dlmspec.data.cli import app
from dlmspec.data.read import read_chunks

NULL_CLI = ["--tokenizer-type", "null", "--vocab-size", "100"]
GOOD = json.dumps({"text": "1 2 3"}).encode() + b"\n"


def _zstd_bomb(path: Path, line_bytes: int) -> Path:
    """A good line, then one line of ``line_bytes`` zero bytes, compressed in one frame."""
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    parts = [compressor.compress(GOOD)]
    block = b"\0" * (1 << 20)
    for _ in range(line_bytes >> 20):
        parts.append(compressor.compress(block))
    parts.append(compressor.compress(b"\n" + GOOD))
    parts.append(compressor.flush())
    path.write_bytes(b"".join(parts))
    return path


def _peak_while(fn):
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_small_zst_file_of_one_endless_line_is_read_in_bounded_memory(tmp_path):
    bomb = _zstd_bomb(tmp_path / "bomb.jsonl.zst", 256 << 20)
    assert bomb.stat().st_size < 64 << 10
    chunks, peak = _peak_while(lambda: list(read_chunks([str(bomb)], 32, 1 << 20, max_line_bytes=1 << 20)))
    assert [c.lines[0][0] for c in chunks if c.lines] == [1]
    assert chunks[-1].too_long == (2, 256 << 20)
    assert peak < 32 << 20, f"peak {peak / (1 << 20):.0f} MiB"
    result = CliRunner().invoke(app, ["prepare", "--no-progress", "--input", str(bomb), "--output-prefix",
                                      str(tmp_path / "out"), *NULL_CLI, "--max-line-bytes", str(1 << 20)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), text
    assert "line 2" in text or ":2" in text, text


def test_gzip_of_a_billion_blank_lines_is_read_quickly(tmp_path):
    member = gzip.compress(b"\n" * (64 << 20), compresslevel=9)
    path = tmp_path / "blank.jsonl.gz"
    with path.open("wb") as f:
        f.write(gzip.compress(GOOD))
        for _ in range(16):  # 1 GiB of newlines in 16 gzip members
            f.write(member)
        f.write(gzip.compress(GOOD))
    assert path.stat().st_size < 8 << 20
    start = time.perf_counter()
    chunks, peak = _peak_while(lambda: list(read_chunks([str(path)], 32, 1 << 20)))
    elapsed = time.perf_counter() - start
    assert [n for c in chunks for n, _ in c.lines] == [1, 2 + (16 << 26)]
    assert elapsed < 60, f"{elapsed:.0f} s"
    assert peak < 32 << 20, f"peak {peak / (1 << 20):.0f} MiB"


def test_a_plain_file_with_one_huge_line_is_measured_not_held(tmp_path):
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as f:
        f.write(GOOD)
        block = b"x" * (1 << 20)
        for _ in range(256):
            f.write(block)
        f.write(b"\n" + GOOD)
    chunks, peak = _peak_while(lambda: list(read_chunks([str(path)], 32, 1 << 20, max_line_bytes=1 << 20)))
    assert chunks[-1].too_long == (2, 256 << 20)
    assert peak < 16 << 20, f"peak {peak / (1 << 20):.0f} MiB"


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_lines_and_blank_runs_keep_their_numbers(tmp_path, suffix):
    """Blank and whitespace-only lines, CRLF ends and a last line without a newline, as numbered
    by the bounded reader across block edges."""
    rows = [b"", b"   ", GOOD.strip(), b"\t\r", b"", GOOD.strip() + b"\r", b" " * 3000, GOOD.strip()]
    data = b"\n".join(rows)
    path = tmp_path / f"in{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else
                     zstandard.ZstdCompressor().compress(data) if suffix.endswith(".zst") else data)
    from dlmspec.data import read

    for block in (1, 2, 7, 64, 1 << 20):
        with _opened(read, path) as stream:
            got = list(read.iter_input_lines(stream.handle.read, 1 << 20, block=block))
        assert [(n, line) for n, line, _ in got] == [(3, GOOD.strip()), (6, GOOD.strip() + b"\r"),
                                                      (8, GOOD.strip())], block


class _opened:
    def __init__(self, read, path):
        self.stream = read._InputStream(str(path))

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc):
        self.stream.close()
