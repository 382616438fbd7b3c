"""``dlmspec data prepare``: JSONL to Megatron indexed datasets (``.bin`` + ``.idx``).

The output is what Megatron-LM's ``tools/preprocess_data.py`` writes, with the same flag names:
one dataset per ``--json-keys`` key, named ``{output_prefix}_{key}_document``, written by
megatron-core's :class:`~megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder` with
``DType.optimal_dtype(vocab_size)``. A document is a JSON line's value under a key: a string,
or a list of strings that become the document's sequences. Empty sequences are dropped, EOD is
appended to the last sequence of non-empty documents with ``--append-eod``, and a document with
no tokens adds a document boundary only, all as Megatron does.

Lines are read in the parent, parsed and tokenized in ``--workers`` processes (at most the
CPUs this process may use) in chunks of lines, and written in input order, so the bytes do not
depend on the worker count. A line is read with a bounded ``readline``: one longer than
``--max-line-bytes`` (default :data:`MAX_LINE_BYTES`) is an error naming the line and its
length, and never sits whole in memory. Every bad line (invalid or too deeply nested JSON, a
missing key, a line too long) stops the run with its line number. Both files
are written as ``PREFIX.tmp-*.bin/.idx`` and renamed at the end (``.idx`` last): an interrupted
run leaves no ``PREFIX.idx``, and a dataset from an earlier run stays intact until the new one
is complete.

Temporary files are named ``PREFIX.tmp-HOST-PID-HEX.bin/.idx`` (``HOST`` the short host name).
SIGTERM and SIGHUP raise :class:`PrepareInterrupted` (a ``KeyboardInterrupt``, as SIGINT
raises) while the files are written, so they are removed on those too; only SIGKILL (or a
crash) leaves them. Each run removes the temporary files under its ``--output-prefix`` whose
process is gone (same host, pid not running) and says so in one line; files of a running
process, or of another host (whose pids cannot be checked from here), are left alone.

Nothing the user wrote is lost: an output file that is an input (``--input`` or a tokenizer
file, by name, through a symlink or as a hard link of it) is refused, with ``--force`` too, and
an existing dataset (or any file at an output name) is replaced only with ``--force``.

:func:`prepare` does the work and returns a :class:`PrepareResult`; :data:`app` is the CLI
(``dlmspec data prepare``). User-input problems raise :class:`DataPrepareError`, which the
command prints in red and turns into exit code 2. torch and megatron are imported inside
functions only.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Iterator, Optional, Sequence

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlmspec.errors import EXIT_USAGE
from dlmspec.tokenizers import (
    TokenizerError,
    TokenizerArgs,
    canonical_tokenizer_type,
    valid_tokenizer_types,
)

#: Megatron's ``level`` in the output name; always ``document`` (no sentence splitting).
LEVEL = "document"
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


class DataPrepareError(Exception):
    """A problem with the user's input; the message says what and where (no traceback)."""


class PrepareInterrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived while :func:`prepare` wrote its temporary files.

    Raised in the main thread by the handler :func:`prepare` installs (only where the signal
    had its default action), so the temporary files are removed as for Ctrl-C.
    ``signum`` is the signal's number; the CLI exits ``128 + signum``, as the shell would.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def dataset_prefix(output_prefix: str, json_key: str, level: str = LEVEL) -> str:
    """Path prefix of one output dataset, as in Megatron-LM's ``preprocess_data.py``."""
    return f"{output_prefix}_{json_key}_{level}"


@dataclass
class DatasetOutput:
    """One written dataset (one ``--json-keys`` key)."""

    json_key: str
    prefix: str
    bin_path: str
    idx_path: str
    documents: int = 0
    empty_documents: int = 0
    sequences: int = 0
    tokens: int = 0


@dataclass
class PrepareResult:
    """What :func:`prepare` wrote; ``to_dict()`` is the ``--json`` summary."""

    input: str
    output_prefix: str
    tokenizer_type: str
    vocab_size: int
    eod: Optional[int]
    dtype: str
    workers: int
    append_eod: bool
    documents: int
    tokens: int
    elapsed_s: float
    datasets: list[DatasetOutput] = field(default_factory=list)
    #: One-line notes printed during the run (stale temporary files removed, ...).
    notes: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tokens_per_s"] = round(self.tokens_per_s, 1)
        data["elapsed_s"] = round(self.elapsed_s, 3)
        return data


# --------------------------------------------------------------------------- reading


@dataclass
class _Chunk:
    lines: list[tuple[int, bytes]]  # (1-based line number, raw line); blank lines left out
    nbytes: int  # bytes of input this chunk covers, blank lines included
    #: (line number, length in bytes) of a line over --max-line-bytes; it ends the input.
    too_long: Optional[tuple[int, int]] = None


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


def _read_chunks(
    path: str, chunk_docs: int, chunk_bytes: int, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[_Chunk]:
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
                        yield _Chunk(lines, size)
                    yield _Chunk([], 0, too_long=(lineno, length))
                    return
                size += len(raw)
                if raw.strip():
                    lines.append((lineno, raw))
                if len(lines) >= chunk_docs or size >= chunk_bytes:
                    yield _Chunk(lines, size)
                    lines, size = [], 0
    except OSError as exc:
        raise DataPrepareError(
            f"--input {path}: cannot read it (line {lineno + 1}): {exc.strerror or exc}"
        ) from None
    if lines or size:
        yield _Chunk(lines, size)


# --------------------------------------------------------------------------- encoding


@dataclass(frozen=True)
class _EncodeConfig:
    tokenizer: TokenizerArgs
    json_keys: tuple[str, ...]
    append_eod: bool
    input_name: str
    dtype: str  # numpy dtype name of the output
    max_line_bytes: int = MAX_LINE_BYTES


@dataclass
class _EncodedKey:
    tokens: Any  # numpy array (output dtype), the chunk's documents concatenated
    sequence_lengths: list[int]
    sequences_per_document: list[int]


@dataclass
class _EncodedChunk:
    nbytes: int
    documents: int
    keys: dict[str, _EncodedKey]


# Per-process state: the tokenizer of this worker (or of the parent with --workers 1).
_STATE: dict[str, Any] = {}


def _init_worker(config: _EncodeConfig) -> None:
    """Pool initializer: the parent handles Ctrl-C; each worker builds its own tokenizer."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in _TERMINATION_SIGNALS:  # the parent's handler is inherited through fork
        signal.signal(signum, signal.SIG_DFL)
    _STATE["config"] = config
    _STATE["tokenizer"] = config.tokenizer.build()


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _short(exc: BaseException, limit: int = 300) -> str:
    """An exception's message, cut to ``limit`` characters (some quote the whole input)."""
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


def _encode_chunk(chunk: _Chunk) -> _EncodedChunk:
    """Parse and tokenize one chunk (runs in a worker); raises DataPrepareError on bad input."""
    import numpy as np

    config: _EncodeConfig = _STATE["config"]
    if chunk.too_long is not None:
        lineno, length = chunk.too_long
        raise DataPrepareError(
            f"{config.input_name}:{lineno}: the line has {length:,} bytes, more than "
            f"--max-line-bytes {config.max_line_bytes:,}; a line is parsed and tokenized whole "
            "in memory (a byte-level BPE needs about 150 bytes per byte of text). Split the "
            f"document, drop the line, or raise the limit: --max-line-bytes {length}"
        )
    tokenizer = _STATE["tokenizer"]
    eod, vocab_size = tokenizer.eod, int(tokenizer.vocab_size)
    dtype = np.dtype(config.dtype)
    # per key: token arrays, sequence lengths, number of sequences per document
    parts: dict[str, tuple[list, list[int], list[int]]] = {
        key: ([], [], []) for key in config.json_keys
    }

    for lineno, raw in chunk.lines:
        where = f"{config.input_name}:{lineno}"
        try:
            record = json.loads(raw)
        except RecursionError:
            raise DataPrepareError(
                f"{where}: invalid JSON (nested deeper than the JSON parser reads, about "
                f"{sys.getrecursionlimit():,} levels); flatten the line or drop it"
            ) from None
        except MemoryError:
            raise DataPrepareError(
                f"{where}: out of memory parsing the line ({len(raw):,} bytes); lower "
                "--max-line-bytes or --workers"
            ) from None
        except json.JSONDecodeError as exc:
            raise DataPrepareError(
                f"{where}: invalid JSON ({exc.msg} at column {exc.colno})"
            ) from None
        except ValueError as exc:  # bytes that are not UTF-8
            raise DataPrepareError(f"{where}: invalid JSON ({exc})") from None
        if not isinstance(record, dict):
            raise DataPrepareError(
                f"{where}: expected a JSON object per line, got a JSON {_json_type(record)}"
            )
        for key in config.json_keys:
            if key not in record:
                present = ", ".join(repr(k) for k in record) or "none"
                raise DataPrepareError(
                    f"{where}: missing key {key!r} (the line has keys: {present}); "
                    "pick the field with --json-keys"
                )
            value = record[key]
            if isinstance(value, str):
                sentences = [value]
            elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                sentences = value
            else:
                raise DataPrepareError(
                    f"{where}: key {key!r} must be a string or a list of strings, "
                    f"got a JSON {_json_type(value)}"
                )
            doc_ids: list[int] = []
            lengths: list[int] = []
            for sentence in sentences:
                try:
                    ids = tokenizer.tokenize(sentence)
                except MemoryError:
                    raise DataPrepareError(
                        f"{where}: out of memory tokenizing key {key!r} (the line has "
                        f"{len(raw):,} bytes); lower --max-line-bytes or --workers"
                    ) from None
                except Exception as exc:
                    raise DataPrepareError(
                        f"{where}: {config.tokenizer.tokenizer_type} cannot tokenize key "
                        f"{key!r}: {_short(exc)}"
                    ) from None
                if len(ids) > 0:
                    doc_ids.extend(ids)
                    lengths.append(len(ids))
            if doc_ids and config.append_eod:
                doc_ids.append(eod)
                lengths[-1] += 1
            arrays, seq_lengths, per_doc = parts[key]
            if doc_ids:
                array = np.asarray(doc_ids, dtype=np.int64)
                low, high = int(array.min()), int(array.max())
                if low < 0 or high >= vocab_size:
                    bad = low if low < 0 else high
                    raise DataPrepareError(
                        f"{where}: key {key!r}: token id {bad} is outside the vocabulary "
                        f"[0, {vocab_size}) of {config.tokenizer.tokenizer_type}"
                    )
                arrays.append(array.astype(dtype))
            seq_lengths.extend(lengths)
            per_doc.append(len(lengths))

    keys = {
        key: _EncodedKey(
            tokens=np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype),
            sequence_lengths=seq_lengths,
            sequences_per_document=per_doc,
        )
        for key, (arrays, seq_lengths, per_doc) in parts.items()
    }
    return _EncodedChunk(nbytes=chunk.nbytes, documents=len(chunk.lines), keys=keys)


def _mp_context() -> Any:
    # fork: workers inherit the already-imported tokenizer libraries (megatron.core takes
    # ~10 s to import); spawn where fork does not exist.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


class _ChunkEncoder:
    """Runs :func:`_encode_chunk` in-process (1 worker) or in a pool, yielding input order.

    The pool variant is an ordered ``imap`` with a bounded window (``2 * workers`` chunks in
    flight): ``Pool.imap`` itself reads its whole input ahead into the task queue, which for
    a multi-GB corpus means the whole corpus in memory.
    """

    def __init__(self, config: _EncodeConfig, tokenizer: Any, workers: int) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.workers = workers
        self.pool: Any = None

    def __enter__(self) -> "_ChunkEncoder":
        if self.workers > 1:
            try:
                self.pool = _mp_context().Pool(
                    self.workers, initializer=_init_worker, initargs=(self.config,)
                )
            except OSError as exc:
                raise DataPrepareError(
                    f"--workers {self.workers}: cannot start the worker processes "
                    f"({exc.strerror or exc}); use fewer --workers"
                ) from None
        else:
            _STATE["config"] = self.config
            _STATE["tokenizer"] = self.tokenizer
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _STATE.clear()
        if self.pool is not None:
            if exc_type is None:
                self.pool.close()
            else:
                self.pool.terminate()
            self.pool.join()
            self.pool = None

    def imap(self, chunks: Iterable[_Chunk]) -> Iterator[_EncodedChunk]:
        if self.pool is None:
            for chunk in chunks:
                yield _encode_chunk(chunk)
            return
        window = 2 * self.workers
        source = iter(chunks)
        pending: deque = deque()
        for chunk in source:
            pending.append(self.pool.apply_async(_encode_chunk, (chunk,)))
            if len(pending) >= window:
                break
        while pending:
            result = pending.popleft().get()
            for chunk in source:
                pending.append(self.pool.apply_async(_encode_chunk, (chunk,)))
                break
            yield result


# --------------------------------------------------------------------------- writing


def _parse_json_keys(json_keys: Sequence[str] | str) -> tuple[str, ...]:
    if isinstance(json_keys, str):
        json_keys = [json_keys]
    keys: list[str] = []
    for item in json_keys:
        for key in str(item).split(","):
            key = key.strip()
            if not key:
                continue
            if key in keys:
                raise DataPrepareError(f"--json-keys names {key!r} twice")
            keys.append(key)
    if not keys:
        raise DataPrepareError("--json-keys is empty; name at least one field (e.g. text)")
    return tuple(keys)


def _check_input(path: str) -> None:
    if not os.path.exists(path):
        raise DataPrepareError(f"input file not found: {path}")
    if not os.path.isfile(path):
        raise DataPrepareError(f"input is not a file: {path}")
    if os.path.getsize(path) == 0:
        raise DataPrepareError(f"input file is empty: {path}")


def _same_file(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name one file (same device and inode, links followed)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _protected_inputs(
    input_name: str, tokenizer_model: str | None, vocab_file: str | None, merge_file: str | None
) -> list[tuple[str, str]]:
    """(flag, path) of every file the run reads, which it must never write over."""
    files = [("--input", input_name)]
    for flag, path in (
        ("--tokenizer-model", tokenizer_model),
        ("--vocab-file", vocab_file),
        ("--merge-file", merge_file),
    ):
        if path and os.path.isfile(path):
            files.append((flag, path))
    return files


def _check_outputs(
    outputs: dict[str, DatasetOutput],
    output_prefix: str,
    protected: list[tuple[str, str]],
    force: bool,
) -> None:
    """Refuse output names that would lose a file; raises :class:`DataPrepareError`.

    An output that is the same file as an input (by name, through a symlink on either side, a
    symlinked folder, or a hard link) is always refused: the commit renames over the output
    name. A folder at an output name is refused (it cannot be renamed over). Any other file
    at an output name (a dataset from an earlier run, a lone ``.bin``) is refused unless
    ``force``.
    """
    existing: list[str] = []
    for out in outputs.values():
        for path in (out.bin_path, out.idx_path):
            for flag, value in protected:
                if _same_file(value, path):
                    if os.path.abspath(value) == os.path.abspath(path):
                        what = "this file is an output"
                    else:
                        what = f"this is the same file as {path} (through a link), an output"
                    raise DataPrepareError(
                        f"{flag} {value}: {what} of --output-prefix {output_prefix} (key "
                        f"{out.json_key!r}), and data prepare never writes over its input "
                        "(--force does not allow this). Pick another --output-prefix, e.g. "
                        f"{output_prefix}-tokens"
                    )
            if os.path.isdir(path) and not os.path.islink(path):
                raise DataPrepareError(
                    f"--output-prefix {output_prefix}: {path} is a folder, where the dataset "
                    "file goes. Pick another --output-prefix, or move the folder"
                )
            if os.path.lexists(path):
                existing.append(path)
    if existing and not force:
        raise DataPrepareError(
            f"--output-prefix {output_prefix}: {', '.join(existing)} already exist "
            "(a dataset from an earlier run?), and data prepare would replace them. Pass "
            "--force to replace them, or pick another --output-prefix"
        )


# --------------------------------------------------------------------------- temporary files

#: Signals that end a run with its temporary files removed (SIGINT raises KeyboardInterrupt).
_TERMINATION_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def _install_termination_handlers() -> dict[int, Any]:
    """Make SIGTERM/SIGHUP raise :class:`PrepareInterrupted` in the main thread.

    Only signals that still have their default action are taken (an ignored SIGHUP under
    ``nohup``, or an application's own handler, stays). A second signal gets the default
    action (the process ends at once). Returns the replaced handlers, for
    :func:`_restore_handlers`; nothing is installed outside the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)
        raise PrepareInterrupted(signum)

    previous: dict[int, Any] = {}
    for signum in _TERMINATION_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            previous[signum] = signal.signal(signum, handler)
    return previous


def _restore_handlers(previous: dict[int, Any]) -> None:
    for signum, old in previous.items():
        signal.signal(signum, old)


def _host_tag() -> str:
    """This host's name as it goes into temporary file names: ``[A-Za-z0-9-]``, no dots."""
    name = socket.gethostname().split(".")[0]
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")[:40] or "host"


def _tmp_tag() -> str:
    """``tmp-HOST-PID-HEX``: the part of this run's temporary file names that is its own."""
    return f"tmp-{_host_tag()}-{os.getpid()}-{secrets.token_hex(4)}"


_TMP_MARK = f"_{LEVEL}.tmp-"


def _tmp_owner(name: str) -> tuple[str, int] | None:
    """``(host, pid)`` of a temporary file name ``*_document.tmp-[HOST-]PID-HEX.{bin,idx}``.

    ``host`` is ``""`` in names without it (written before hosts were named); None when
    ``name`` is not a temporary file name of :func:`prepare`.
    """
    stem, _, ext = name.rpartition(".")
    _, mark, tag = stem.rpartition(_TMP_MARK)
    if ext not in ("bin", "idx") or not mark:
        return None
    parts = tag.split("-")
    if len(parts) < 2:
        return None
    host, pid, hex_part = "-".join(parts[:-2]), parts[-2], parts[-1]
    if not (pid.isascii() and pid.isdigit()) or not re.fullmatch(r"[0-9a-f]{8}", hex_part):
        return None
    return host, int(pid)


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (a pid of another user counts)."""
    if os.name != "posix":
        return True  # no cheap check: keep the files
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):
        return False
    return True


def _size_text(nbytes: int) -> str:
    if nbytes < 1000:
        return f"{nbytes} B"
    for unit, scale in (("KB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if nbytes < 1000 * scale or unit == "GB":
            return f"{nbytes / scale:,.1f} {unit}"
    raise AssertionError("unreachable")


def _remove_stale_tmp(output_prefix: str, protected: list[tuple[str, str]]) -> list[str]:
    """Remove the temporary files of dead runs under ``output_prefix``; returns the notes.

    A file is one of ours by its name (:func:`_tmp_owner`), below the prefix's folder and
    starting with ``{basename(output_prefix)}_``, for any key. It is removed when it was
    written on this host (or before hosts were named) by a pid that does not run. Files of a
    live pid or of another host are kept and named in a note; an input file is never removed.
    A pid reused by an unrelated process keeps its files until that process ends.
    """
    directory = os.path.dirname(output_prefix) or "."
    start = os.path.basename(output_prefix) + "_"
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    host = _host_tag()
    removed: dict[int, list[str]] = {}
    kept: dict[str, list[str]] = {}
    freed = 0
    failed: list[str] = []
    for name in names:
        owner = _tmp_owner(name) if name.startswith(start) else None
        if owner is None:
            continue
        file_host, pid = owner
        path = os.path.join(directory, name)
        if file_host and file_host != host:
            owner_text = f"of host {file_host} (its pid {pid} cannot be checked from here)"
            kept.setdefault(owner_text, []).append(path)
            continue
        if pid == os.getpid() or _pid_alive(pid):
            kept.setdefault(f"of a running process (pid {pid})", []).append(path)
            continue
        if any(_same_file(value, path) for _, value in protected):
            continue
        try:
            info = os.lstat(path)
            if os.path.isdir(path) and not os.path.islink(path):
                continue
            os.remove(path)
        except OSError as exc:
            failed.append(f"{path} ({exc.strerror})")
            continue
        freed += info.st_size
        removed.setdefault(pid, []).append(path)
    notes = []
    if removed:
        count = sum(len(paths) for paths in removed.values())
        pids = ", ".join(str(pid) for pid in removed)
        paths = ", ".join(p for group in removed.values() for p in group)
        notes.append(
            f"removed {count} stale temporary file{'s' if count != 1 else ''} "
            f"({_size_text(freed)}) of interrupted runs (pid {pids}: not running): {paths}"
        )
    for owner_text, paths in kept.items():
        notes.append(
            f"left {len(paths)} temporary file{'s' if len(paths) != 1 else ''} {owner_text} "
            f"alone: {', '.join(paths)}"
        )
    if failed:
        notes.append(f"could not remove stale temporary files: {', '.join(failed)}")
    return notes


def _note(console: Console, notes: list[str], text: str) -> None:
    """Print a one-line note on ``console`` and keep it for the result."""
    notes.append(text)
    console.print(f"note: {text}", style="yellow", markup=False, highlight=False, soft_wrap=True)


def _cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, as under SLURM or taskset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _progress(console: Console) -> Any:
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("tokenizing"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[documents]:,} docs"),
        TextColumn("{task.fields[tokens]:,} tokens"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def prepare(
    input_path: str | os.PathLike,
    output_prefix: str | os.PathLike,
    *,
    tokenizer_type: str,
    tokenizer_model: str | None = None,
    vocab_file: str | None = None,
    merge_file: str | None = None,
    vocab_size: int | None = None,
    json_keys: Sequence[str] | str = ("text",),
    workers: int = 1,
    append_eod: bool = False,
    force: bool = False,
    max_line_bytes: int = MAX_LINE_BYTES,
    show_progress: bool = False,
    console: Console | None = None,
    chunk_docs: int = CHUNK_DOCS,
    chunk_bytes: int = CHUNK_BYTES,
) -> PrepareResult:
    """Tokenize a JSONL file into one Megatron indexed dataset per JSON key.

    Args:
        input_path: JSONL file, one JSON object per line (blank lines are skipped).
        output_prefix: datasets go to ``{output_prefix}_{key}_document.{bin,idx}``.
        tokenizer_type, tokenizer_model, vocab_file, merge_file, vocab_size: passed to
            :func:`dlmspec.tokenizers.build_tokenizer`.
        json_keys: fields to tokenize, one dataset each (``"a,b"`` also splits).
        workers: tokenizer processes; 1 tokenizes in this process. More than the CPUs this
            process may use is capped there, with a note. Output bytes do not depend on it.
        append_eod: append the tokenizer's EOD to every non-empty document.
        force: replace files at the output names (a dataset from an earlier run). An output
            that is an input file is refused even so.
        max_line_bytes: longest line read, in bytes, newline not counted; a longer line is
            a DataPrepareError naming it (it is measured, never held whole in memory).
        show_progress: draw a rich progress bar on ``console`` (default: stderr).
        chunk_docs, chunk_bytes: size of the unit of work sent to a worker.

    Returns:
        A :class:`PrepareResult` with the counts and the written paths.

    Raises:
        DataPrepareError: bad input file, JSON (also nested too deeply), keys, a line over
            ``max_line_bytes``, or tokenizer arguments; an output name that is an input file,
            or (without ``force``) already exists; a write error (disk full). Any exception
            (and KeyboardInterrupt) removes the temporary files; no ``.idx`` is left behind.
        PrepareInterrupted: SIGTERM or SIGHUP during the run (temporary files removed).
    """
    input_name = os.fspath(input_path)
    output_prefix = os.fspath(output_prefix)
    keys = _parse_json_keys(json_keys)
    if int(workers) < 1:
        raise DataPrepareError(f"--workers must be at least 1, got {workers}")
    if int(max_line_bytes) < 1:
        raise DataPrepareError(f"--max-line-bytes must be at least 1, got {max_line_bytes}")
    console = console or Console(stderr=True)
    notes: list[str] = []
    workers = int(workers)
    cpus = _cpu_count()
    if workers > cpus:
        _note(
            console,
            notes,
            f"--workers {workers:,} is more than the {cpus} CPUs this process can use; "
            f"using {cpus} workers",
        )
        workers = cpus
    _check_input(input_name)
    outputs = {
        key: DatasetOutput(
            json_key=key,
            prefix=dataset_prefix(output_prefix, key),
            bin_path=dataset_prefix(output_prefix, key) + ".bin",
            idx_path=dataset_prefix(output_prefix, key) + ".idx",
        )
        for key in keys
    }
    protected = _protected_inputs(
        input_name,
        *(None if p is None else os.fspath(p) for p in (tokenizer_model, vocab_file, merge_file)),
    )
    _check_outputs(outputs, output_prefix, protected, bool(force))
    try:
        spec = TokenizerArgs(
            tokenizer_type=canonical_tokenizer_type(tokenizer_type),
            tokenizer_model=None if tokenizer_model is None else os.fspath(tokenizer_model),
            vocab_file=None if vocab_file is None else os.fspath(vocab_file),
            merge_file=None if merge_file is None else os.fspath(merge_file),
            vocab_size=vocab_size,
        )
        tokenizer = spec.build()
    except TokenizerError as exc:
        raise DataPrepareError(str(exc)) from None
    if append_eod and tokenizer.eod is None:
        raise DataPrepareError(
            f"--append-eod: the {spec.tokenizer_type} tokenizer has no end-of-document token"
        )

    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    vocab = int(tokenizer.vocab_size)
    dtype = np.dtype(DType.optimal_dtype(vocab))
    out_dir = os.path.dirname(dataset_prefix(output_prefix, keys[0]))
    if out_dir:
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as exc:
            raise DataPrepareError(
                f"cannot create output directory {out_dir}: {exc.strerror}"
            ) from None

    for text in _remove_stale_tmp(output_prefix, protected):
        _note(console, notes, text)

    tag = _tmp_tag()
    tmp = {key: f"{outputs[key].prefix}.{tag}" for key in keys}
    handlers: dict[int, Any] = {}
    builders: dict[str, Any] = {}
    renamed_bins: set[str] = set()
    config = _EncodeConfig(
        tokenizer=spec,
        json_keys=keys,
        append_eod=bool(append_eod),
        input_name=input_name,
        dtype=dtype.name,
        max_line_bytes=int(max_line_bytes),
    )
    documents = 0
    start = time.perf_counter()
    try:
        handlers.update(_install_termination_handlers())
        for key in keys:
            try:
                builders[key] = IndexedDatasetBuilder(tmp[key] + ".bin", dtype=dtype.type)
            except OSError as exc:
                raise DataPrepareError(f"cannot write {tmp[key]}.bin: {exc.strerror}") from None

        with _ChunkEncoder(config, tokenizer, workers) as encoder:
            progress = (
                _progress(console)
                if show_progress
                else contextlib.nullcontext()
            )
            with progress:
                task = None
                if show_progress:
                    task = progress.add_task(
                        "tokenizing",
                        total=os.path.getsize(input_name),
                        documents=0,
                        tokens=0,
                    )
                chunks = _read_chunks(
                    input_name, max(1, chunk_docs), max(1, chunk_bytes), int(max_line_bytes)
                )
                for encoded in encoder.imap(chunks):
                    for key, part in encoded.keys.items():
                        _write_documents(builders[key], part, outputs[key])
                    documents += encoded.documents
                    if task is not None:
                        progress.update(
                            task,
                            advance=encoded.nbytes,
                            documents=documents,
                            tokens=sum(o.tokens for o in outputs.values()),
                        )

        if documents == 0:
            raise DataPrepareError(f"input file has no JSON lines (only blank lines): {input_name}")
        for key in keys:
            builders[key].finalize(tmp[key] + ".idx")
        # Commit: an .idx next to a .bin marks a complete dataset, so the old .idx goes
        # first and the new one comes last.
        for key in keys:
            out = outputs[key]
            _remove(out.idx_path)
            os.replace(tmp[key] + ".bin", out.bin_path)
            renamed_bins.add(key)
            os.replace(tmp[key] + ".idx", out.idx_path)
    except BaseException as exc:
        for key in keys:
            builder = builders.get(key)
            if builder is not None:
                with contextlib.suppress(Exception):
                    builder.data_file.close()
            _remove(tmp[key] + ".bin")
            _remove(tmp[key] + ".idx")
            if key in renamed_bins and not os.path.exists(outputs[key].idx_path):
                _remove(outputs[key].bin_path)
        if isinstance(exc, OSError):  # disk full, quota, permissions: input reads raise their own
            where = f" ({exc.filename})" if exc.filename else ""
            raise DataPrepareError(
                f"--output-prefix {output_prefix}: cannot write the dataset in "
                f"{out_dir or os.curdir}{where}: {exc.strerror or exc}; temporary files removed"
            ) from None
        raise
    finally:
        _restore_handlers(handlers)
    elapsed = time.perf_counter() - start

    return PrepareResult(
        input=input_name,
        output_prefix=output_prefix,
        tokenizer_type=spec.tokenizer_type,
        vocab_size=vocab,
        eod=tokenizer.eod,
        dtype=dtype.name,
        workers=workers,
        append_eod=bool(append_eod),
        documents=documents,
        tokens=sum(o.tokens for o in outputs.values()),
        elapsed_s=elapsed,
        datasets=[outputs[key] for key in keys],
        notes=notes,
    )


def _write_documents(builder: Any, part: _EncodedKey, out: DatasetOutput) -> None:
    """Append a chunk's documents of one key, one ``add_document`` per document."""
    offset = 0
    seq = 0
    for count in part.sequences_per_document:
        lengths = part.sequence_lengths[seq : seq + count]
        size = sum(lengths)
        builder.add_document(part.tokens[offset : offset + size], lengths)
        offset += size
        seq += count
        out.documents += 1
        out.sequences += count
        out.tokens += size
        if count == 0:
            out.empty_documents += 1


# --------------------------------------------------------------------------- CLI

app = typer.Typer(
    help="Prepare training data for megatron-core.",
    add_completion=False,
    no_args_is_help=True,
)


@app.callback()
def _data_group() -> None:
    """Prepare training data for megatron-core."""


def _print_summary(console: Console, result: PrepareResult) -> None:
    table = Table(title="dlmspec data prepare", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [
        ("input", result.input),
        (
            "tokenizer",
            f"{result.tokenizer_type} (vocab {result.vocab_size:,}, eod {result.eod}, "
            f"{result.dtype})",
        ),
        ("documents", f"{result.documents:,}"),
        ("tokens", f"{result.tokens:,}"),
        ("elapsed", f"{result.elapsed_s:.2f} s ({result.workers} workers)"),
        ("tokens/s", f"{result.tokens_per_s:,.0f}"),
    ]
    for out in result.datasets:
        detail = f"{out.documents:,} documents, {out.tokens:,} tokens"
        if out.empty_documents:
            detail += f", {out.empty_documents:,} empty"
        rows.append((f"key {out.json_key}", f"{out.prefix}.{{bin,idx}} ({detail})"))
    for name, value in rows:
        table.add_row(Text(name), Text(value))  # Text: no markup in paths or keys
    console.print(table)


@app.command("prepare")
def prepare_command(
    input: str = typer.Option(..., "--input", help="JSONL file, one JSON object per line."),
    output_prefix: str = typer.Option(
        ..., "--output-prefix", help="Writes OUTPUT_PREFIX_{key}_document.bin/.idx per key."
    ),
    tokenizer_type: str = typer.Option(
        ..., "--tokenizer-type", help=f"One of {valid_tokenizer_types()}."
    ),
    tokenizer_model: Optional[str] = typer.Option(
        None,
        "--tokenizer-model",
        help="HuggingFace directory/name, SentencePiece .model, or tiktoken vocab .json.",
    ),
    vocab_file: Optional[str] = typer.Option(None, "--vocab-file", help="GPT-2 vocab.json."),
    merge_file: Optional[str] = typer.Option(None, "--merge-file", help="GPT-2 merges.txt."),
    vocab_size: Optional[int] = typer.Option(
        None, "--vocab-size", help="NullTokenizer vocabulary size (TikTokenizer: total size)."
    ),
    json_keys: list[str] = typer.Option(
        ["text"], "--json-keys", help="Field(s) to tokenize, one dataset each; repeat or a,b."
    ),
    workers: int = typer.Option(
        1, "--workers", help="Tokenizer processes (capped at the CPUs this process can use)."
    ),
    max_line_bytes: int = typer.Option(
        MAX_LINE_BYTES,
        "--max-line-bytes",
        help="Longest line (document) read, in bytes, newline not counted; a longer line is "
        "an error naming it. Each worker holds a line whole while tokenizing it: about 150x "
        "its size with a byte-level BPE.",
    ),
    append_eod: bool = typer.Option(
        False, "--append-eod", help="Append the tokenizer's EOD id to every document."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Replace an existing dataset at the output names (never an input file).",
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    show_progress: bool = typer.Option(
        True, "--progress/--no-progress", help="Progress bar on stderr."
    ),
) -> None:
    """Tokenize JSONL into Megatron indexed datasets (as Megatron-LM's preprocess_data.py)."""
    err = Console(stderr=True)
    try:
        result = prepare(
            input,
            output_prefix,
            tokenizer_type=tokenizer_type,
            tokenizer_model=tokenizer_model,
            vocab_file=vocab_file,
            merge_file=merge_file,
            vocab_size=vocab_size,
            json_keys=json_keys,
            workers=workers,
            append_eod=append_eod,
            force=force,
            max_line_bytes=max_line_bytes,
            show_progress=show_progress,
            console=err,
        )
    except DataPrepareError as exc:
        err.print(f"error: {exc}", style="bold red", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(code=EXIT_USAGE) from None
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, PrepareInterrupted) else int(signal.SIGINT)
        err.print(
            f"interrupted ({signal.Signals(signum).name}): temporary files removed, "
            "no dataset written",
            style="bold red",
            markup=False,
        )
        raise typer.Exit(code=128 + signum) from None
    if json_output:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        _print_summary(Console(), result)
