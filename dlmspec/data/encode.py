"""Parsing and tokenizing chunks of input lines for ``dlmspec data prepare``, in this process
(``--workers 1``) or in a pool of worker processes, the results in input order, so the output's
bytes do not depend on the worker count.

numpy is imported inside :func:`encode_chunk` (a worker), not at import time: ``dlmspec data
--help`` works without the runtime extra.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import sys
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

from dlmspec.data.errors import DataPrepareError
from dlmspec.data.outputs import TERMINATION_SIGNALS
from dlmspec.data.read import MAX_LINE_BYTES, Chunk
from dlmspec.tokenizers import TokenizerArgs


@dataclass(frozen=True)
class EncodeConfig:
    """What every worker needs: the tokenizer to build, the keys, the EOD choice, the input's
    name (for messages), the output dtype and the line limit (for its message)."""

    tokenizer: TokenizerArgs
    json_keys: tuple[str, ...]
    append_eod: bool
    input_name: str
    dtype: str  # numpy dtype name of the output
    max_line_bytes: int = MAX_LINE_BYTES
    #: ``"line"`` (a JSONL file: ``NAME:LINE``) or ``"row"`` (``--hf-dataset``: ``NAME, row I``).
    unit: str = "line"

    def where(self, number: int, source: str | None = None) -> str:
        """Where a document is, for messages: ``FILE:LINE`` (``source``: the file of several
        ``--input`` files) or ``SOURCE, row INDEX``."""
        if self.unit == "row":
            return f"{self.input_name}, row {number}"
        return f"{source or self.input_name}:{number}"


@dataclass
class EncodedKey:
    """One key's tokens of a chunk's documents."""

    tokens: Any  # numpy array (output dtype), the chunk's documents concatenated
    sequence_lengths: list[int]
    sequences_per_document: list[int]


@dataclass
class EncodedChunk:
    """A chunk, tokenized: its input bytes, its documents and the tokens per key."""

    nbytes: int
    documents: int
    keys: dict[str, EncodedKey]
    #: The documents' line numbers (rows: indices) in their file, and that file's place in the
    #: input list: where a shard ends, for ``--resume``.
    lines: tuple[int, ...] = ()
    file_index: int = 0


# Per-process state: the tokenizer of this worker (or of the parent with --workers 1).
_STATE: dict[str, Any] = {}


#: Signals blocked while the pool forks its workers (see :meth:`ChunkEncoder.__enter__`).
_FORK_BLOCKED = (signal.SIGINT, *TERMINATION_SIGNALS)


def _init_worker(config: EncodeConfig) -> None:
    """Pool initializer: the parent handles Ctrl-C; each worker builds its own tokenizer.

    A worker starts with the stop signals blocked (the pool forks under that mask): until
    here it holds the parent's handlers, which would raise ``PrepareInterrupted`` in a copy
    of the parent's stack (one that removes the parent's temporary files). A signal that came
    in between stays pending and takes its default action once unblocked below.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in TERMINATION_SIGNALS:  # the parent's handler is inherited through fork
        signal.signal(signum, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORK_BLOCKED)
    _STATE["config"] = config
    _STATE["tokenizer"] = config.tokenizer.build()


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _short(exc: BaseException, limit: int = 300) -> str:
    """An exception's message, cut to ``limit`` characters (some quote the whole input)."""
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


def encode_chunk(chunk: Chunk) -> EncodedChunk:
    """Parse and tokenize one chunk (runs in a worker); raises DataPrepareError on bad input.

    A line is parsed as JSON; a row (``--hf-dataset``) is a dict already, and then is tokenized
    as the JSON line with the same values would be."""
    import numpy as np

    config: EncodeConfig = _STATE["config"]
    if chunk.too_long is not None:
        lineno, length = chunk.too_long
        raise DataPrepareError(
            f"{config.where(lineno, chunk.source)}: the line has {length:,} bytes, more than "
            f"--max-line-bytes {config.max_line_bytes:,}; a line is parsed and tokenized whole "
            "in memory (a byte-level BPE needs about 150 bytes per byte of text). Split the "
            f"document, drop the line, or raise the limit: --max-line-bytes {length}"
        )
    tokenizer = _STATE["tokenizer"]
    eod, vocab_size = tokenizer.eod, int(tokenizer.vocab_size)
    dtype = np.dtype(config.dtype)
    # per key: the chunk's token ids (one flat list), sequence lengths, sequences per document,
    # and (end offset in the flat list, line number) of each document with tokens, for the
    # vocabulary check (:func:`_check_ids`), done once a chunk instead of once a document
    parts: dict[str, tuple[list[int], list[int], list[int], list[tuple[int, int]]]] = {
        key: ([], [], [], []) for key in config.json_keys
    }

    try:
        for lineno, raw in chunk.lines:
            _encode_line(config, tokenizer, eod, chunk, lineno, raw, parts)
    except DataPrepareError:
        _check_ids(config, chunk, vocab_size, parts)  # an earlier line's bad id is reported first
        raise
    arrays = _check_ids(config, chunk, vocab_size, parts)

    keys = {
        key: EncodedKey(
            tokens=arrays[key].astype(dtype),
            sequence_lengths=seq_lengths,
            sequences_per_document=per_doc,
        )
        for key, (_, seq_lengths, per_doc, _) in parts.items()
    }
    return EncodedChunk(nbytes=chunk.nbytes, documents=len(chunk.lines), keys=keys,
                        lines=tuple(n for n, _ in chunk.lines), file_index=chunk.file_index)


def _encode_line(config: EncodeConfig, tokenizer: Any, eod: Any, chunk: Chunk, lineno: int, raw: Any,
                 parts: dict[str, tuple[list[int], list[int], list[int], list[tuple[int, int]]]]) -> None:
    """Parse and tokenize one line (or row) into ``parts`` (:func:`encode_chunk`'s lists, per key);
    raises DataPrepareError on bad input."""
    try:
        record = raw if isinstance(raw, dict) else json.loads(raw)
    except RecursionError:
        raise DataPrepareError(
            f"{config.where(lineno, chunk.source)}: invalid JSON (nested deeper than the JSON parser reads, about "
            f"{sys.getrecursionlimit():,} levels); flatten the line or drop it"
        ) from None
    except MemoryError:
        raise DataPrepareError(
            f"{config.where(lineno, chunk.source)}: out of memory parsing the line ({len(raw):,} bytes); lower "
            "--max-line-bytes or --workers"
        ) from None
    except json.JSONDecodeError as exc:
        raise DataPrepareError(
            f"{config.where(lineno, chunk.source)}: invalid JSON ({exc.msg} at column {exc.colno})"
        ) from None
    except ValueError as exc:  # bytes that are not UTF-8
        raise DataPrepareError(f"{config.where(lineno, chunk.source)}: invalid JSON ({exc})") from None
    if not isinstance(record, dict):
        raise DataPrepareError(
            f"{config.where(lineno, chunk.source)}: expected a JSON object per line, got a JSON {_json_type(record)}"
        )
    for key in config.json_keys:
        if key not in record:
            present = ", ".join(repr(k) for k in record) or "none"
            raise DataPrepareError(
                f"{config.where(lineno, chunk.source)}: missing key {key!r} (the {config.unit} has keys: {present}); "
                "pick the field with --json-keys"
            )
        value = record[key]
        if isinstance(value, str):
            sentences = [value]
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            sentences = value
        else:
            raise DataPrepareError(
                f"{config.where(lineno, chunk.source)}: key {key!r} must be a string or a list of strings, "
                f"got {'a JSON ' if config.unit == 'line' else ''}{_json_type(value)}"
            )
        flat, seq_lengths, per_doc, ends = parts[key]
        count = 0
        for sentence in sentences:
            try:
                ids = tokenizer.tokenize(sentence)
            except MemoryError:
                raise DataPrepareError(
                    f"{config.where(lineno, chunk.source)}: out of memory tokenizing key {key!r} (the line has "
                    f"{len(raw):,} bytes); lower --max-line-bytes or --workers"
                ) from None
            except Exception as exc:
                raise DataPrepareError(
                    f"{config.where(lineno, chunk.source)}: {config.tokenizer.tokenizer_type} cannot tokenize key "
                    f"{key!r}: {_short(exc)}"
                ) from None
            if len(ids) > 0:
                flat.extend(ids)
                seq_lengths.append(len(ids))
                count += 1
        if count and config.append_eod:
            flat.append(eod)
            seq_lengths[-1] += 1
        if count:
            ends.append((len(flat), lineno))
        per_doc.append(count)


def _check_ids(config: EncodeConfig, chunk: Chunk, vocab_size: int,
               parts: dict[str, tuple[list[int], list[int], list[int], list[tuple[int, int]]]]) -> dict[str, Any]:
    """The chunk's token ids as one int64 array per key, after checking that each is in the
    vocabulary ``[0, vocab_size)``.

    Raises:
        DataPrepareError: an id outside it, naming the first document (in input order, then key
            order) that holds one, and that document's lowest id when it is negative, else its
            highest, as a check of each document on its own would.
    """
    import numpy as np

    arrays: dict[str, Any] = {}
    first: Optional[tuple[int, int, str, int]] = None  # (line number, key index, key, bad id)
    for index, (key, (flat, _, _, ends)) in enumerate(parts.items()):
        # the documents added so far (a line that failed half-way has left its ids out)
        size = ends[-1][0] if ends else 0
        array = np.asarray(flat[:size] if size < len(flat) else flat, dtype=np.int64)
        arrays[key] = array
        if array.size == 0 or (int(array.min()) >= 0 and int(array.max()) < vocab_size):
            continue
        at = int(np.argmax((array < 0) | (array >= vocab_size)))
        stops = np.asarray([end for end, _ in ends])
        doc = int(np.searchsorted(stops, at, side="right"))
        start = 0 if doc == 0 else int(stops[doc - 1])
        ids = array[start:int(stops[doc])]
        low, high = int(ids.min()), int(ids.max())
        found = (ends[doc][1], index, key, low if low < 0 else high)
        if first is None or found[:2] < first[:2]:
            first = found
    if first is not None:
        lineno, _, key, bad = first
        raise DataPrepareError(
            f"{config.where(lineno, chunk.source)}: key {key!r}: token id {bad} is outside the vocabulary "
            f"[0, {vocab_size}) of {config.tokenizer.tokenizer_type}"
        )
    return arrays


def mp_context() -> Any:
    """The multiprocessing context of the worker pool: fork, so that workers inherit the
    already-imported tokenizer libraries (megatron.core takes ~10 s to import); spawn where fork
    does not exist."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


class ChunkEncoder:
    """Runs :func:`encode_chunk` in-process (1 worker) or in a pool, yielding input order.

    The pool variant is an ordered ``imap`` with a bounded window (``2 * workers`` chunks in
    flight): ``Pool.imap`` itself reads its whole input ahead into the task queue, which for
    a multi-GB corpus means the whole corpus in memory.
    """

    def __init__(self, config: EncodeConfig, tokenizer: Any, workers: int) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.workers = workers
        self.pool: Any = None

    def __enter__(self) -> "ChunkEncoder":
        if self.workers > 1:
            # The workers, and the pool's threads (which fork replacements), start with the
            # stop signals blocked; _init_worker unblocks them in each worker.
            masked = hasattr(signal, "pthread_sigmask")
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, _FORK_BLOCKED) if masked else None
            try:
                self.pool = mp_context().Pool(
                    self.workers, initializer=_init_worker, initargs=(self.config,)
                )
            except OSError as exc:
                raise DataPrepareError(
                    f"--workers {self.workers}: cannot start the worker processes "
                    f"({exc.strerror or exc}); use fewer --workers"
                ) from None
            finally:
                if masked:
                    signal.pthread_sigmask(signal.SIG_SETMASK, previous)
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

    def imap(self, chunks: Iterable[Chunk]) -> Iterator[EncodedChunk]:
        """The chunks encoded, in input order; raises the first worker's DataPrepareError."""
        if self.pool is None:
            for chunk in chunks:
                yield encode_chunk(chunk)
            return
        window = 2 * self.workers
        source = iter(chunks)
        pending: deque = deque()
        for chunk in source:
            pending.append(self.pool.apply_async(encode_chunk, (chunk,)))
            if len(pending) >= window:
                break
        while pending:
            result = pending.popleft().get()
            for chunk in source:
                pending.append(self.pool.apply_async(encode_chunk, (chunk,)))
                break
            yield result
