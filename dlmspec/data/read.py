"""Reading the input of ``dlmspec data prepare``: the JSONL file's lines in chunks, the unit of
work a tokenizer worker gets.

A line is read with a bounded ``readline``: one longer than ``--max-line-bytes`` (default
:data:`MAX_LINE_BYTES`) ends the input with a chunk that names the line and its length, and never
sits whole in memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from dlmspec.data.errors import DataPrepareError

#: A chunk sent to a worker holds at most this many lines ...
CHUNK_DOCS = 32
#: ... or about this many bytes, whichever comes first.
CHUNK_BYTES = 1 << 20
#: Default ``--max-line-bytes``: the longest line (one document) read, newline not counted.
#: A line is parsed and tokenized whole; GPT-2 byte-level BPE (HuggingFace ``tokenizers``)
#: peaked at about 150 bytes of memory per byte of text (a 4 MB line: +620 MB resident), so
#: 8 MiB keeps a worker near 1.3 GB while allowing book-length documents.
MAX_LINE_BYTES = 8 << 20
#: Block size for measuring (not keeping) the rest of a line over the limit.
_SKIP_BLOCK = 1 << 20


@dataclass
class Chunk:
    """A run of input lines for one worker."""

    #: (1-based line number, raw line), blank lines left out; or, for ``--hf-dataset``
    #: (:mod:`dlmspec.data.hub`), (0-based row index, the row's ``--json-keys`` values as a dict).
    lines: list[tuple[int, Any]]
    nbytes: int  # bytes of input this chunk covers, blank lines included (rows: characters)
    #: (line number, length in bytes) of a line over --max-line-bytes; it ends the input.
    too_long: Optional[tuple[int, int]] = None


def check_input(path: str) -> None:
    """Raise :class:`DataPrepareError` unless ``path`` is a non-empty file (``--input``)."""
    if not os.path.exists(path):
        raise DataPrepareError(f"--input {path}: file not found; give a JSONL file (one JSON object per line, "
                               "e.g. {\"text\": \"...\"}), or --hf-dataset NAME for a Hugging Face dataset")
    if not os.path.isfile(path):
        raise DataPrepareError(f"--input {path}: not a file; give one JSONL file (a folder of .jsonl/.parquet/.csv "
                               "files is read with --hf-dataset FOLDER)")
    if os.path.getsize(path) == 0:
        raise DataPrepareError(f"--input {path}: the file is empty; give a JSONL file with one document per line")


def _rest_of_line(handle: Any) -> int:
    """Read to the end of the current line in blocks; returns its bytes, newline not counted."""
    total = 0
    while True:
        block = handle.readline(_SKIP_BLOCK)
        if not block:
            return total
        if block.endswith(b"\n"):
            return total + len(block) - 1
        total += len(block)


def read_chunks(
    path: str, chunk_docs: int, chunk_bytes: int, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[Chunk]:
    """Chunks of the input's lines; at most ``max_line_bytes + 1`` bytes of a line are read.

    A line longer than ``max_line_bytes`` (newline not counted) ends the input with a chunk
    whose ``too_long`` names it (the lines before it come first, so errors keep input order).
    Raises DataPrepareError when the file cannot be read.
    """
    lines: list[tuple[int, bytes]] = []
    size = 0
    lineno = 0
    try:
        with open(path, "rb") as handle:
            while True:
                raw = handle.readline(max_line_bytes + 1)
                if not raw:
                    break
                lineno += 1
                if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                    length = len(raw) + _rest_of_line(handle)
                    if lines or size:
                        yield Chunk(lines, size)
                    yield Chunk([], 0, too_long=(lineno, length))
                    return
                size += len(raw)
                if raw.strip():
                    lines.append((lineno, raw))
                if len(lines) >= chunk_docs or size >= chunk_bytes:
                    yield Chunk(lines, size)
                    lines, size = [], 0
    except OSError as exc:
        raise DataPrepareError(
            f"--input {path}: cannot read it (line {lineno + 1}): {exc.strerror or exc}"
        ) from None
    if lines or size:
        yield Chunk(lines, size)
