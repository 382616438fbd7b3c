"""The dataset record: ``PREFIX.dlmspec.json``, written beside ``PREFIX.bin`` / ``PREFIX.idx``.

``dlmspec data prepare`` writes one record per dataset it writes, so that ``validate``, the
runtime, ``data inspect`` and SFT can tell how a dataset was made without re-reading it: the
tokenizer (type, files with their SHA-256, vocabulary size, EOD id), the document and token
counts, and, for SFT data, a ``"sft"`` section (chat template, the ids given to chat special
tokens, the response-mask dataset, bad-row counts).

Layout (``version`` 1)::

    {"schema": "dlmspec.dataset", "version": 1,
     "tokenizer": {"type": "GPT2BPETokenizer", "vocab_size": 50257, "eod_id": 50256,
                   "files": {"vocab_file": {"path": "...", "sha256": "..."}, ...}},
     "documents": 1000, "tokens": 123456,
     "sft": null | {...}}

Sections other than ``schema`` and ``version`` are optional; a reader ignores keys it does
not know, so a section may gain keys without a new version. Datasets written by Megatron-LM's
``preprocess_data.py`` (or by dlmspec before this record existed) have no record:
:func:`read_record` returns ``None`` and callers treat the facts it would hold as unknown.

The record is written atomically (a temporary file renamed over the final name), after the
``.bin``/``.idx`` it describes.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from dlmspec.names import DATASET_RECORD_SUFFIX
from dlmspec.files import FileRefused, default_mode, read_json, write_atomic

#: ``schema`` of a dataset record.
SCHEMA = "dlmspec.dataset"
#: The record layout this module writes and reads.
VERSION = 1
#: File name suffix after the dataset prefix.
SUFFIX = DATASET_RECORD_SUFFIX


class RecordError(ValueError):
    """A record file exists but cannot be read: not JSON, not a dict, or another schema.

    Attributes:
        path: The record's path.
        reason: Why it was refused, in words.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def record_path(prefix: str) -> str:
    """The record's path of dataset ``prefix`` (the path Megatron's ``IndexedDataset`` takes,
    without ``.bin``/``.idx``)."""
    return prefix + SUFFIX


def file_sha256(path: str, chunk_bytes: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes (read in ``chunk_bytes`` pieces).

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def tokenizer_section(
    tokenizer_type: str, *, vocab_size: int | None, eod_id: int | None, files: dict[str, str | None]
) -> dict[str, Any]:
    """The ``"tokenizer"`` section: ``files`` maps Megatron's argument names (``vocab_file``,
    ``merge_file``, ``tokenizer_model``) to paths; each present file is recorded with its
    SHA-256 so a later check can tell a changed file from a moved one.

    Raises:
        OSError: a named file cannot be read.
    """
    recorded: dict[str, Any] = {}
    for key in sorted(files):
        path = files[key]
        if path is None:
            continue
        entry: dict[str, Any] = {"path": str(path)}
        if os.path.isfile(path):
            entry["sha256"] = file_sha256(path)
        recorded[key] = entry
    return {"type": tokenizer_type, "vocab_size": vocab_size, "eod_id": eod_id, "files": recorded}


def write_record(prefix: str, **sections: Any) -> str:
    """Write ``PREFIX.dlmspec.json`` with ``sections`` (JSON-serialisable values) after the
    schema and version; keys are sorted so the same dataset gives the same bytes.

    Returns:
        The record's path.

    Raises:
        OSError: the folder is not writable.
        TypeError: a section is not JSON-serialisable.
    """
    body = {"schema": SCHEMA, "version": VERSION, **sections}
    return write_json(record_path(prefix), body)


def write_json(path: str, body: Any) -> str:
    """Write ``body`` as JSON (indented, keys sorted: the same body gives the same bytes) to
    ``path`` atomically (:func:`dlmspec.files.write_atomic`: a temporary file created exclusively
    in the same folder, never through a link, renamed over ``path``); readable as the umask allows. Also the manifests and progress file of :mod:`dlmspec.data.shards`.

    Returns:
        ``path``.

    Raises:
        OSError: the folder is not writable.
        TypeError: ``body`` is not JSON-serialisable.
    """
    text = json.dumps(body, indent=2, sort_keys=True) + "\n"
    write_atomic(path, text, mode=default_mode())  # as readable as the dataset beside it (the umask applies)
    return path


def read_record(prefix: str) -> dict[str, Any] | None:
    """The record of dataset ``prefix``, or ``None`` when it has none.

    Raises:
        RecordError: the file exists but is not a dataset record this version can read: not a
            regular file (a FIFO, a device), larger than :data:`dlmspec.files.MAX_RECORD_BYTES`,
            nested past :data:`dlmspec.files.MAX_NESTING`, not JSON, or another schema (a newer
            ``version`` is refused, so a reader never guesses at a layout it does not know).
    """
    path = record_path(prefix)
    if not os.path.exists(path):  # a dangling link too: no record
        return None
    try:
        body = read_json(path, what="dataset record")
    except FileRefused as exc:
        raise RecordError(path, f"{exc.why}; {exc.hint}") from None
    if not isinstance(body, dict) or body.get("schema") != SCHEMA:
        raise RecordError(path, f"not a dataset record (its 'schema' is not {SCHEMA!r})")
    version = body.get("version")
    if not isinstance(version, int) or version > VERSION or version < 1:
        raise RecordError(path, f"record version {version!r}; this dlmspec reads versions 1..{VERSION}")
    return body
