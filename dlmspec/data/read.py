"""Reading the input of ``dlmspec data prepare``: the ``--input`` values resolved to files (a
file, a folder, a glob, repeated), each read as a stream of lines (plain, ``.gz`` or ``.zst``), in
chunks, the unit of work a tokenizer worker gets.

A file is read (and decompressed) :data:`READ_BLOCK` bytes at a time and cut into lines
(:func:`iter_input_lines`): a line longer than ``--max-line-bytes`` (default
:data:`MAX_LINE_BYTES`) ends the input with a chunk that names the line and its length, and never
sits whole in memory; runs of blank lines are counted a block at a time. A compressed file is
decompressed as it is read (``gzip`` from the standard library, ``.zst`` with the ``zstandard``
package), at most a block at a time whatever its ratio, so memory does not grow with the input's
size or with what a small compressed file expands to.
"""

from __future__ import annotations

import glob
import io
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

from dlmspec.credentials import redact_text
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
#: File names a folder given to ``--input`` contributes (other files in it are left out).
INPUT_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst")
_GLOB_CHARS = frozenset("*?[")


@dataclass
class Chunk:
    """A run of input lines for one worker (never across two input files)."""

    #: (1-based line number, raw line), blank lines left out; or, for ``--hf-dataset``
    #: (:mod:`dlmspec.data.hub`), (0-based row index, the row's ``--json-keys`` values as a dict).
    lines: list[tuple[int, Any]]
    #: bytes of the input file this chunk covers, blank lines included (for a compressed file, of
    #: the compressed file, about: its reader reads ahead); rows: characters. For progress only.
    nbytes: int
    #: (line number, length in bytes) of a line over --max-line-bytes; it ends the input.
    too_long: Optional[tuple[int, int]] = None
    #: The input file the lines are from (None: the only input, or a Hugging Face dataset).
    source: Optional[str] = None
    #: Its place in the resolved input list (0 for a single input).
    file_index: int = 0


@dataclass(frozen=True)
class InputFile:
    """One input file, as :func:`resolve_inputs` found it: the path as the user's value gave it,
    its size in bytes and its modification time (ns since the epoch), which the dataset record
    keeps and ``--resume`` compares."""

    path: str
    size: int
    mtime_ns: int

    def to_dict(self) -> dict[str, Any]:
        """``{"path": absolute path, "bytes": size, "mtime": ISO-8601 UTC, "mtime_ns": int}``; a
        token-shaped part of the path (a folder named ``hf_...``) is redacted
        (:func:`dlmspec.credentials.redact_text`), as the dataset record and the progress file
        keep it."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.mtime_ns / 1e9))
        return {"path": redact_text(os.path.abspath(self.path)), "bytes": self.size, "mtime": stamp,
                "mtime_ns": self.mtime_ns}


def check_input(path: str) -> None:
    """Raise :class:`DataPrepareError` unless ``path`` is a non-empty file (``--input``)."""
    if not os.path.exists(path):
        raise DataPrepareError(f"--input {path}: file not found; give a JSONL file (one JSON object per line, "
                               "e.g. {\"text\": \"...\"}), a folder of them, a quoted glob ('data/*.jsonl.gz'), "
                               "or --hf-dataset NAME for a Hugging Face dataset")
    if not os.path.isfile(path):
        raise DataPrepareError(f"--input {path}: not a file; give a JSONL file (.jsonl, .jsonl.gz or .jsonl.zst), "
                               "a folder of them or a quoted glob")
    if os.path.getsize(path) == 0:
        raise DataPrepareError(f"--input {path}: the file is empty; give a JSONL file with one document per line")


def _stat(path: str) -> InputFile:
    info = os.stat(path)
    return InputFile(path, info.st_size, info.st_mtime_ns)


def resolve_inputs(values: Sequence[str] | str) -> list[InputFile]:
    """The files the ``--input`` values name, in a deterministic order.

    Each value, in the order given, is a file (taken as is, whatever its name), a folder (its
    files ending in one of :data:`INPUT_SUFFIXES`, in its subfolders too, hidden ones left out,
    sorted by path), or a glob (``*``, ``?``, ``[...]``; ``**`` spans folders; its matches sorted
    by path). Files are read in that order, as one stream of documents.

    Raises:
        DataPrepareError: a value names nothing (no file, an empty folder, a glob without a
            match), a named file is missing or empty, or one file is named twice (a document
            would be trained on twice; list it once).
    """
    if isinstance(values, (str, os.PathLike)):
        values = [os.fspath(values)]
    if not values:
        raise DataPrepareError("--input: give at least one JSONL file, folder or quoted glob")
    found: list[InputFile] = []
    seen: dict[str, str] = {}
    for value in values:
        value = os.fspath(value)
        if os.path.isdir(value):
            paths = sorted(
                os.path.join(root, name)
                for root, dirs, names in os.walk(value)
                for name in names
                if not name.startswith(".") and name.endswith(INPUT_SUFFIXES)
                and not any(part.startswith(".") for part in os.path.relpath(root, value).split(os.sep) if part != ".")
            )
            if not paths:
                raise DataPrepareError(
                    f"--input {value}: the folder has no input files (names ending in "
                    f"{', '.join(INPUT_SUFFIXES)}); name the files or a glob, e.g. --input '{value}/*.txt.jsonl'"
                )
        elif not os.path.exists(value) and _GLOB_CHARS & set(value):
            paths = sorted(p for p in glob.glob(value, recursive=True) if os.path.isfile(p))
            if not paths:
                raise DataPrepareError(
                    f"--input {value}: the glob matches no file; check the pattern (quote it so that "
                    "dlmspec, not the shell, expands it), e.g. --input 'data/*.jsonl.gz'"
                )
        else:
            paths = [value]
        for path in paths:
            check_input(path)
            key = os.path.realpath(path)
            if key in seen:
                raise DataPrepareError(
                    f"--input {value}: {path} is also named by --input {seen[key]}; every document would be "
                    "read twice. List each file once"
                )
            seen[key] = value
            found.append(_stat(path))
    return found


def compression(path: str) -> Optional[str]:
    """``"gzip"`` for a ``.gz`` name, ``"zstd"`` for ``.zst``/``.zstd``, None for a plain file."""
    lower = path.lower()
    if lower.endswith(".gz"):
        return "gzip"
    if lower.endswith((".zst", ".zstd")):
        return "zstd"
    return None


#: Decompressed (or, for a plain file, read) bytes taken at a time: the most a read holds besides
#: the current line, whatever the compression ratio (a zstd frame of zeros expands 30,000-fold).
READ_BLOCK = 1 << 20
#: Bytes of the compressed file the zstd decoder reads at a time.
_ZSTD_READ = 1 << 16
_ZSTD_MAGIC = 0xFD2FB528


def zstd_frames_complete(handle: Any) -> bool:
    """Whether the ``.zst`` file open as ``handle`` (seekable, binary) ends where its last frame
    ends: the frames' headers and block headers are walked (RFC 8878: a frame header, blocks of
    3-byte headers whose last one has bit 0 set, RLE blocks 1 byte of content, then a 4-byte
    checksum when the header asks for one; skippable frames ``0x184D2A5?`` with a 4-byte
    length), block contents are skipped, nothing is decompressed. False: truncated or not zstd."""
    import zstandard

    size = os.fstat(handle.fileno()).st_size
    pos = 0
    while pos < size:
        handle.seek(pos)
        head = handle.read(18)
        if len(head) < 8:
            return False
        magic = int.from_bytes(head[:4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:
            pos += 8 + int.from_bytes(head[4:8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            return False
        try:
            pos += zstandard.frame_header_size(head)
        except zstandard.ZstdError:
            return False
        checksum = (head[4] >> 2) & 1
        while True:
            handle.seek(pos)
            block = handle.read(3)
            if len(block) < 3:
                return False
            header = int.from_bytes(block, "little")
            kind, length = (header >> 1) & 3, header >> 3
            pos += 3 + (1 if kind == 1 else length)
            if pos > size:
                return False
            if header & 1:
                break
        pos += 4 * checksum
    return pos == size


class _ZstdRaw(io.RawIOBase):
    """A ``.zst`` file decompressed as it is read, frame after frame, at most the buffer's size at
    a time (``zstandard``'s ``stream_reader``: a small file of zeros never expands in memory).
    When the stream ends, the file's frame structure is checked (:func:`zstd_frames_complete`):
    a file that ends inside a frame raises ``EOFError``, an error rather than a short input."""

    def __init__(self, raw: Any, zstandard: Any) -> None:
        super().__init__()
        self._raw = raw
        self._reader = zstandard.ZstdDecompressor().stream_reader(
            raw, read_size=_ZSTD_READ, read_across_frames=True, closefd=False)
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._done:
            return 0
        n = self._reader.readinto(buffer)
        if n:
            return n
        self._done = True
        position = self._raw.tell()
        if not zstd_frames_complete(self._raw):
            raise EOFError("the file ends inside a zstd frame (truncated?)")
        self._raw.seek(position)
        return 0

    def close(self) -> None:
        try:
            self._reader.close()
        finally:
            super().close()


def _first_not_blank(data: bytes, pos: int) -> int:
    """The index of the first byte of ``data`` at or after ``pos`` that ``bytes.strip()`` does not
    strip (ASCII whitespace), ``len(data)`` when there is none. ``bytes.lstrip`` of windows that
    double from 64 bytes: a blank run is scanned in C about once (faster than a regular-expression
    search), and a line that starts at once costs one small window."""
    size, window = len(data), 64
    while pos < size:
        end = min(pos + window, size)
        kept = len(data[pos:end].lstrip())
        if kept:
            return end - kept
        pos, window = end, window * 2
    return size


class _InputStream:
    """A binary reader over one input file, decompressing as it reads (``read(n)`` gives at most
    ``n`` bytes, whatever the compression ratio); ``position()`` is the offset reached in the file
    on disk (compressed bytes), for progress."""

    def __init__(self, path: str) -> None:
        self.path = path
        kind = compression(path)
        zstandard = None
        if kind == "zstd":
            try:
                import zstandard
            except ImportError:
                raise DataPrepareError(
                    f"--input {path}: a .zst file needs the zstandard package, which is not installed: "
                    "pip install zstandard (or decompress it: zstd -d FILE)"
                ) from None
        self.raw = open(path, "rb")
        try:
            if kind == "gzip":
                import gzip

                self.handle: Any = gzip.GzipFile(fileobj=self.raw, mode="rb")
            elif kind == "zstd":
                self.handle = io.BufferedReader(_ZstdRaw(self.raw, zstandard), 1 << 16)
            else:
                self.handle = self.raw
        except BaseException:
            self.raw.close()
            raise

    def position(self) -> int:
        return self.raw.tell()

    def close(self) -> None:
        if self.handle is not self.raw:
            try:
                self.handle.close()
            except Exception:  # noqa: BLE001  (a corrupt stream's close re-raises its error)
                pass
        self.raw.close()


def iter_input_lines(read: Any, max_line_bytes: int, block: int = READ_BLOCK) -> Iterator[tuple[int, Optional[bytes], int]]:
    """The non-blank lines of a stream: ``(line number, line, length)``, 1-based, newline not
    included; ``line`` is None for a line longer than ``max_line_bytes`` (its ``length`` measured,
    its bytes never kept). ``read(n)`` gives at most ``n`` bytes (b"" at the end).

    Memory: at most ``max_line_bytes + block`` bytes of a line are held. Blank lines (nothing but
    ASCII whitespace, as ``bytes.strip`` strips) are counted, not yielded, a block at a time
    (:func:`_first_not_blank`), so a run of a billion blank lines costs a few seconds of reading.
    The last line may lack its newline.
    """
    lineno = 0
    parts: list[bytes] = []
    length = 0
    over = False
    while True:
        data = read(block)
        if not data:
            break
        pos, size = 0, len(data)
        while pos < size:
            if length == 0:  # at a line start: skip a run of blank lines in one step
                stop = _first_not_blank(data, pos)
                found = stop < size
                newlines = data.count(b"\n", pos, stop)
                if newlines:
                    lineno += newlines
                    pos = data.rindex(b"\n", pos, stop) + 1
                if not found:  # whitespace to the block's end: the start of a line
                    if pos < size:
                        parts, length = [data[pos:]], size - pos
                        over = length > max_line_bytes
                        if over:
                            parts = []
                    break
            end = data.find(b"\n", pos)
            piece = data[pos:] if end < 0 else data[pos:end]
            length += len(piece)
            if not over:
                if length > max_line_bytes:
                    over, parts = True, []
                else:
                    parts.append(piece)
            if end < 0:
                break
            lineno += 1
            if over:
                yield lineno, None, length
            else:
                line = parts[0] if len(parts) == 1 else b"".join(parts)
                if line.strip():
                    yield lineno, line, length
            parts, length, over = [], 0, False
            pos = end + 1
    if length:
        lineno += 1
        if over:
            yield lineno, None, length
        else:
            line = b"".join(parts)
            if line.strip():
                yield lineno, line, length


def _read_error(path: str, lineno: int, exc: BaseException) -> DataPrepareError:
    kind = compression(path)
    what = getattr(exc, "strerror", None) or exc
    hint = f"; is it a whole {kind} file? (test it: {'gzip -t' if kind == 'gzip' else 'zstd -t'} {path})" if kind else ""
    return DataPrepareError(f"--input {path}: cannot read it (line {lineno + 1}): {what}{hint}")


def _file_chunks(path: str, index: int, source: Optional[str], chunk_docs: int, chunk_bytes: int,
                 max_line_bytes: int, after_line: int, go_on: bool = False) -> Iterator[Chunk]:
    """The chunks of one file; lines up to ``after_line`` are read and left out (a resumed run).

    Raises:
        DataPrepareError: the file cannot be read or decompressed, or it has fewer than
            ``after_line`` lines (a progress file that points past the input's end).
    """
    lines: list[tuple[int, bytes]] = []
    size = 0
    lineno = 0
    stream = None
    try:
        stream = _InputStream(path)
        mark = stream.position()
        for lineno, raw, length in iter_input_lines(stream.handle.read, max_line_bytes):
            if lineno <= after_line:
                continue
            if raw is None:
                if lines:
                    now = stream.position()
                    yield Chunk(lines, size + now - mark, source=source, file_index=index)
                    lines, size, mark = [], 0, now
                yield Chunk([], 0, too_long=(lineno, length), source=source, file_index=index)
                if go_on:
                    continue
                return
            lines.append((lineno, raw))
            size += length + 1
            if len(lines) >= chunk_docs or size >= chunk_bytes:
                now = stream.position()
                yield Chunk(lines, now - mark, source=source, file_index=index)
                lines, size, mark = [], 0, now
        size = stream.position() - mark
    except DataPrepareError:
        raise
    except (OSError, EOFError, ValueError) as exc:  # gzip/zstd: a truncated or corrupt stream
        raise _read_error(path, lineno, exc) from None
    except Exception as exc:  # zstandard.ZstdError is not an OSError
        if type(exc).__module__.startswith("zstandard") or "Zstd" in type(exc).__name__:
            raise _read_error(path, lineno, exc) from None
        raise
    finally:
        if stream is not None:
            stream.close()
    if after_line and lineno < after_line:
        raise DataPrepareError(
            f"--resume: the progress file says the last complete shard ends at line {after_line:,} of "
            f"--input {path}, whose last non-blank line is line {lineno:,}; the file is not the "
            "interrupted run's input (or the progress file was changed). Pass --force (instead of "
            "--resume) to start over"
        )
    if lines or size:
        yield Chunk(lines, size, source=source, file_index=index)


def read_chunks(
    path: str | Sequence[str],
    chunk_docs: int,
    chunk_bytes: int,
    max_line_bytes: int = MAX_LINE_BYTES,
    start_after: Optional[tuple[int, int]] = None,
    skip_too_long: bool = False,
) -> Iterator[Chunk]:
    """Chunks of the input's lines; at most ``max_line_bytes + 1`` bytes of a line are read.

    ``path`` is one file or a list of files (:func:`resolve_inputs`), read in order; a chunk
    never spans two files, and with several files each chunk's ``source`` names its file.
    ``.gz`` and ``.zst`` files are decompressed as they are read. ``start_after`` =
    ``(file index, line number)`` leaves out every line up to and including that one (they
    are read, not parsed: a resumed run continues after its last complete shard).

    A line longer than ``max_line_bytes`` (newline not counted) ends the input with a chunk
    whose ``too_long`` names it (the lines before it come first, so errors keep input order);
    with ``skip_too_long`` that chunk comes and the input goes on after the line.
    Raises DataPrepareError when a file cannot be read (or decompressed, or ``zstandard`` is
    missing for a ``.zst`` file).
    """
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    several = len(paths) > 1
    first_file, after_line = start_after if start_after is not None else (0, 0)
    for index, one in enumerate(paths):
        one = os.fspath(one)
        if index < first_file:
            continue
        skip = after_line if index == first_file else 0
        for chunk in _file_chunks(one, index, one if several else None, chunk_docs, chunk_bytes,
                                  max_line_bytes, skip, skip_too_long):
            yield chunk
            if chunk.too_long is not None and not skip_too_long:
                return
