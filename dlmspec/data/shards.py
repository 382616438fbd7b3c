"""Sharded output and resumable runs of ``dlmspec data prepare`` (``--shard-size``, ``--resume``).

With ``--shard-size N`` (tokens) the documents go to numbered shards, each a Megatron indexed
dataset per ``--json-keys`` key, ``PREFIX-00000_KEY_document.{bin,idx}``, ``PREFIX-00001_...``, and
at the end a manifest per key, ``PREFIX_KEY_document.manifest.json``::

    {"kind": "dlmspec-dataset-manifest", "version": 1,
     "shards": [{"path": "PREFIX-00000_KEY_document", "documents": 1000, "tokens": 2000000}, ...],
     "tokenizer": {...the dataset record's "tokenizer" section...},
     "json_key": "KEY", "documents": ..., "tokens": ..., "shard_size": N, "inputs": [...]}

(``path`` relative to the manifest's folder, without ``.bin``/``.idx``; a spec's ``data.train``
may name the manifest). A shard ends after the document that brings one key's shard to ``N``
tokens or more; shard ``i`` holds the same documents for every key. Each shard is written to
temporary names and renamed when complete (:func:`dlmspec.data.outputs.commit_datasets`), then
gets its record (``PREFIX-00000_KEY_document.dlmspec.json``) and is entered in the progress file
``PREFIX.prepare-progress.json``: the run's arguments and, per complete shard, its counts, file
sizes and the input line it ends at. An interrupted run (Ctrl-C, SIGTERM, a crash) keeps its
complete shards; the same command with ``--resume`` checks the arguments against the progress
file, skips the input up to the last complete shard's line (read, not parsed) and goes on, so the
shards are the bytes an uninterrupted run writes.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Optional, Sequence

from dlmspec.data.errors import DataPrepareError
from dlmspec.data.outputs import (
    DatasetOutput,
    commit_datasets,
    dataset_prefix,
    discard_partial,
    remove_file,
    tmp_tag,
)
from dlmspec.data.record import write_json, write_record
from dlmspec.files import FileRefused, read_json
from dlmspec.names import DATASET_RECORD_SUFFIX

MANIFEST_KIND = "dlmspec-dataset-manifest"
MANIFEST_VERSION = 1
MANIFEST_SUFFIX = ".manifest.json"
PROGRESS_KIND = "dlmspec-prepare-progress"
PROGRESS_VERSION = 1
PROGRESS_SUFFIX = ".prepare-progress.json"
#: Digits of the shard number in names (more shards than 10**5 widen it).
SHARD_DIGITS = 5

_SIZE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]?)\s*$")
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
#: Tokenizer file keys of the record, as the flags that name them.
_FILE_FLAGS = {"tokenizer_model": "--tokenizer-model", "vocab_file": "--vocab-file", "merge_file": "--merge-file"}


def parse_shard_size(value: str | int | None) -> Optional[int]:
    """``--shard-size``: tokens per shard, as ``2000000000``, ``2e9``, ``500M``, ``1.5G`` or
    ``100k`` (K, M, G, T: 10**3, 10**6, 10**9, 10**12, decimal); None stays None.

    Raises:
        DataPrepareError: not a number of that form, or under 1 token.
    """
    if value is None:
        return None
    text = str(value)
    match = _SIZE.match(text)
    number = None
    if match:
        try:
            number = float(match.group(1).replace("_", "")) * _SCALE[match.group(2).lower()]
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or number != int(number) or number < 1:
        raise DataPrepareError(
            f"--shard-size {text}: not a whole number of tokens of at least 1; give tokens per shard "
            "as 2000000000, 2e9 or 2G (K, M, G, T = 10^3, 10^6, 10^9, 10^12), e.g. --shard-size 500M"
        )
    return int(number)


def shard_prefix(output_prefix: str, index: int, key: str) -> str:
    """Dataset prefix of shard ``index`` of ``key``: ``PREFIX-00000_KEY_document``."""
    return dataset_prefix(f"{output_prefix}-{index:0{SHARD_DIGITS}d}", key)


def manifest_path(output_prefix: str, key: str) -> str:
    """``PREFIX_KEY_document.manifest.json``."""
    return dataset_prefix(output_prefix, key) + MANIFEST_SUFFIX


def progress_path(output_prefix: str) -> str:
    """``PREFIX.prepare-progress.json``: the progress file of a sharded run."""
    return output_prefix + PROGRESS_SUFFIX


def _shard_name_pattern(output_prefix: str, keys: Sequence[str]) -> re.Pattern:
    base = re.escape(os.path.basename(output_prefix))
    alternatives = "|".join(re.escape(k) for k in keys)
    return re.compile(rf"^{base}-(\d{{{SHARD_DIGITS},}})_(?:{alternatives})_document"
                      rf"(?:\.bin|\.idx|{re.escape(DATASET_RECORD_SUFFIX)})$")


def existing_outputs(output_prefix: str, keys: Sequence[str]) -> list[str]:
    """Files of a sharded dataset at ``output_prefix`` for ``keys``: shards (``.bin``, ``.idx``,
    records), manifests and the progress file, sorted."""
    folder = os.path.dirname(output_prefix) or "."
    pattern = _shard_name_pattern(output_prefix, keys)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    found = [os.path.join(os.path.dirname(output_prefix), n) for n in names if pattern.match(n)]
    for path in [manifest_path(output_prefix, k) for k in keys] + [progress_path(output_prefix)]:
        if os.path.lexists(path):
            found.append(path)
    return sorted(found)


def check_protected(output_prefix: str, keys: Sequence[str], protected: list[tuple[str, str]]) -> None:
    """Refuse a sharded output that could be an input file (by its name in the output folder, or
    through a link to an existing output file); ``--force`` does not allow it.

    Raises:
        DataPrepareError: naming the flag and file.
    """
    folder = os.path.realpath(os.path.dirname(output_prefix) or ".")
    pattern = _shard_name_pattern(output_prefix, keys)
    fixed = {os.path.basename(manifest_path(output_prefix, k)) for k in keys}
    fixed.add(os.path.basename(progress_path(output_prefix)))
    existing = existing_outputs(output_prefix, keys)
    for flag, value in protected:
        real = os.path.realpath(value)
        name = os.path.basename(real)
        clash = os.path.dirname(real) == folder and (pattern.match(name) or name in fixed)
        clash = clash or any(os.path.exists(p) and os.path.samefile(p, value) for p in existing)
        if clash:
            raise DataPrepareError(
                f"{flag} {value}: this file is named like an output of --output-prefix {output_prefix} "
                "--shard-size (a shard, manifest or progress file), and data prepare never writes over "
                f"its input (--force does not allow this). Pick another --output-prefix, e.g. {output_prefix}-tokens"
            )


def run_arguments(inputs: list[dict[str, Any]], tokenizer: dict[str, Any], keys: Sequence[str],
                  append_eod: bool, shard_size: int, dtype: str) -> dict[str, Any]:
    """What decides a sharded run's bytes, as the progress file keeps it and ``--resume``
    compares it: the input files (path, size, mtime), the tokenizer section (its files' SHA-256),
    the keys, ``--append-eod``, ``--shard-size`` and the token dtype. ``--workers`` and
    ``--max-line-bytes`` do not change the bytes and are left out."""
    return {
        "inputs": [{"path": i["path"], "bytes": i["bytes"], "mtime_ns": i["mtime_ns"]} for i in inputs],
        "tokenizer": tokenizer,
        "json_keys": list(keys),
        "append_eod": bool(append_eod),
        "shard_size": int(shard_size),
        "dtype": dtype,
    }


def differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between the interrupted run's arguments and this run's, each in words naming
    the flag (``--input FILE: changed since ...``); empty when they are the same."""
    found: list[str] = []
    old_in, new_in = before.get("inputs") or [], now["inputs"]
    old_paths, new_paths = [i["path"] for i in old_in], [i["path"] for i in new_in]
    if old_paths != new_paths:
        gone = [p for p in old_paths if p not in new_paths]
        added = [p for p in new_paths if p not in old_paths]
        if gone:
            found.append(f"--input: {', '.join(gone[:3])} {'was' if len(gone) == 1 else 'were'} read by the "
                         "interrupted run and not now")
        if added:
            found.append(f"--input: {', '.join(added[:3])} {'is' if len(added) == 1 else 'are'} new")
        if not gone and not added:
            found.append("--input: the same files in another order")
    else:
        for old, new in zip(old_in, new_in):
            if (old.get("bytes"), old.get("mtime_ns")) != (new["bytes"], new["mtime_ns"]):
                found.append(f"--input {new['path']}: changed since the interrupted run (was {old.get('bytes')} "
                             f"bytes, mtime_ns {old.get('mtime_ns')}; now {new['bytes']} bytes, mtime_ns "
                             f"{new['mtime_ns']})")
    old_tok, new_tok = before.get("tokenizer") or {}, now["tokenizer"]
    if old_tok.get("type") != new_tok.get("type"):
        found.append(f"--tokenizer-type: {old_tok.get('type')} then, {new_tok.get('type')} now")
    elif old_tok.get("vocab_size") != new_tok.get("vocab_size"):
        found.append(f"--vocab-size: the vocabulary had {old_tok.get('vocab_size')} ids then, "
                     f"{new_tok.get('vocab_size')} now")
    old_files, new_files = old_tok.get("files") or {}, new_tok.get("files") or {}
    for key in sorted(set(old_files) | set(new_files)):
        flag = _FILE_FLAGS.get(key, key)
        old, new = old_files.get(key), new_files.get(key)
        if old is None or new is None:
            found.append(f"{flag}: {'given now, not then' if old is None else 'given then, not now'}")
        elif old.get("path") != new.get("path"):
            found.append(f"{flag}: {old.get('path')} then, {new.get('path')} now")
        elif old.get("sha256") != new.get("sha256"):
            found.append(f"{flag} {new.get('path')}: its contents changed (sha256 {str(old.get('sha256'))[:12]}... "
                         f"then, {str(new.get('sha256'))[:12]}... now)")
    for name, flag in (("json_keys", "--json-keys"), ("append_eod", "--append-eod"),
                       ("shard_size", "--shard-size"), ("dtype", "the token dtype")):
        if before.get(name) != now[name]:
            old, new = before.get(name), now[name]
            if name == "json_keys":
                old, new = ",".join(old or []), ",".join(new)
            found.append(f"{flag}: {old} then, {new} now")
    return found


def read_progress(path: str) -> Optional[dict[str, Any]]:
    """The progress file, or None when there is none.

    Raises:
        DataPrepareError: it exists but is not a progress file this version reads (not a
            regular file, too large or too deeply nested: :func:`dlmspec.files.read_json`).
    """
    if not os.path.exists(path):
        return None
    try:
        body = read_json(path, what="progress file")
    except FileRefused as exc:
        body = None
        why = exc.why
    if body is not None and (not isinstance(body, dict) or body.get("kind") != PROGRESS_KIND
                             or body.get("version") != PROGRESS_VERSION):
        why = f"not a progress file of this dlmspec (kind {PROGRESS_KIND!r}, version {PROGRESS_VERSION})"
        body = None
    if body is None:
        raise DataPrepareError(f"--resume: {path}: {why}; pass --force (instead of --resume) to start over")
    return body


class ShardWriter:
    """Writes the documents of a sharded run: one shard open at a time (temporary names), cut
    after the document that fills it, committed, recorded, and entered in the progress file.

    Args:
        output_prefix: ``--output-prefix``.
        keys: the ``--json-keys``.
        shard_size: tokens per shard (:func:`parse_shard_size`).
        builder_class, dtype: megatron-core's ``IndexedDatasetBuilder`` and the numpy dtype.
        tokenizer: the record's tokenizer section; inputs: the input files' dicts.
        arguments: :func:`run_arguments`, kept in the progress file.
        kept: the complete shards of the interrupted run (from its progress file), resumed after.
    """

    def __init__(self, output_prefix: str, keys: Sequence[str], shard_size: int, builder_class: Any,
                 dtype: Any, tokenizer: dict[str, Any], inputs: list[dict[str, Any]],
                 arguments: dict[str, Any], kept: Optional[list[dict[str, Any]]] = None) -> None:
        self.output_prefix = output_prefix
        self.keys = list(keys)
        self.shard_size = shard_size
        self.builder_class = builder_class
        self.dtype = dtype
        self.tokenizer = tokenizer
        self.inputs = inputs
        self.arguments = arguments
        self.shards: list[dict[str, Any]] = list(kept or [])
        self.resumed = len(self.shards)
        self.tag = tmp_tag()
        self.builders: dict[str, Any] = {}
        self.current: dict[str, DatasetOutput] = {}
        self.tmp: dict[str, str] = {}
        self.committed: set = set()
        self.last: Optional[tuple[int, int]] = None

    # ---------------------------------------------------------------- the current shard
    def _open(self) -> None:
        index = len(self.shards)
        for key in self.keys:
            prefix = shard_prefix(self.output_prefix, index, key)
            self.current[key] = DatasetOutput(json_key=key, prefix=prefix, bin_path=prefix + ".bin",
                                              idx_path=prefix + ".idx")
            self.tmp[key] = f"{prefix}.{self.tag}"
            try:
                self.builders[key] = self.builder_class(self.tmp[key] + ".bin", dtype=self.dtype.type)
            except OSError as exc:
                raise DataPrepareError(f"cannot write {self.tmp[key]}.bin: {exc.strerror}") from None

    def add(self, encoded: Any) -> None:
        """Write an encoded chunk's documents (:class:`dlmspec.data.encode.EncodedChunk`), cutting
        the shard after the document that fills it."""
        cursors = {key: [0, 0] for key in self.keys}
        for d in range(encoded.documents):
            if not self.builders:
                self._open()
            fullest = 0
            for key in self.keys:
                part, cursor, out = encoded.keys[key], cursors[key], self.current[key]
                count = part.sequences_per_document[d]
                lengths = part.sequence_lengths[cursor[1]:cursor[1] + count]
                size = sum(lengths)
                self.builders[key].add_document(part.tokens[cursor[0]:cursor[0] + size], lengths)
                cursor[0] += size
                cursor[1] += count
                out.documents += 1
                out.sequences += count
                out.tokens += size
                out.empty_documents += count == 0
                fullest = max(fullest, out.tokens)
            self.last = (encoded.file_index, encoded.lines[d] if encoded.lines else 0)
            if fullest >= self.shard_size:
                self.cut()

    def cut(self) -> None:
        """Finish the open shard: finalize, rename into place, write its records, enter it in the
        progress file. Nothing happens when no shard is open."""
        if not self.builders:
            return
        for key in self.keys:
            self.builders[key].finalize(self.tmp[key] + ".idx")
        commit_datasets(self.current, self.tmp, self.committed)
        index = len(self.shards)
        entry: dict[str, Any] = {"index": index, "end": list(self.last or (0, 0)), "keys": {}}
        for key, out in self.current.items():
            write_record(out.prefix, tokenizer=self.tokenizer, documents=out.documents, tokens=out.tokens,
                         inputs=self.inputs, shard={"index": index, "shard_size": self.shard_size,
                                                    "manifest": os.path.basename(manifest_path(self.output_prefix, key))})
            entry["keys"][key] = {"documents": out.documents, "tokens": out.tokens, "sequences": out.sequences,
                                  "empty_documents": out.empty_documents,
                                  "bin_bytes": os.path.getsize(out.bin_path), "idx_bytes": os.path.getsize(out.idx_path)}
        self.shards.append(entry)
        self.builders, self.current, self.tmp, self.committed = {}, {}, {}, set()
        self.write_progress(complete=False)

    def discard(self) -> None:
        """After a failure: remove the open shard's temporary files (complete shards stay)."""
        if self.current:
            discard_partial(self.current, self.tmp, self.builders, self.committed)
        self.builders, self.current, self.tmp, self.committed = {}, {}, {}, set()

    # ---------------------------------------------------------------- progress and manifests
    def write_progress(self, complete: bool) -> None:
        """Write ``PREFIX.prepare-progress.json`` (atomically)."""
        write_json(progress_path(self.output_prefix), {
            "kind": PROGRESS_KIND, "version": PROGRESS_VERSION, "complete": complete,
            "arguments": self.arguments, "shards": self.shards,
        })

    def finish(self) -> dict[str, str]:
        """Cut the last shard, write the manifests and mark the progress file complete; returns
        the manifest path per key."""
        self.cut()
        manifests = {}
        for key in self.keys:
            path = manifest_path(self.output_prefix, key)
            folder = os.path.dirname(os.path.abspath(path))
            listed = []
            for entry in self.shards:
                prefix = shard_prefix(self.output_prefix, entry["index"], key)
                counts = entry["keys"][key]
                listed.append({"path": os.path.relpath(os.path.abspath(prefix), folder),
                               "documents": counts["documents"], "tokens": counts["tokens"]})
            write_json(path, {
                "kind": MANIFEST_KIND, "version": MANIFEST_VERSION, "shards": listed,
                "tokenizer": self.tokenizer, "json_key": key, "shard_size": self.shard_size,
                "documents": sum(s["documents"] for s in listed), "tokens": sum(s["tokens"] for s in listed),
                "inputs": self.inputs,
            })
            manifests[key] = path
        self.write_progress(complete=True)
        return manifests

    def kept_text(self) -> str:
        """One line for an interrupted run: what is kept and how to go on."""
        n = len(self.shards)
        if n == 0:
            return "no shard was complete, so nothing is kept; rerun the same command to start again"
        last = shard_prefix(self.output_prefix, n - 1, self.keys[0])
        return (f"{n:,} complete shard{'s' if n != 1 else ''} kept (the last {last}.{{bin,idx}}); rerun the "
                f"same command with --resume to continue after it (progress: {progress_path(self.output_prefix)})")


def check_kept_shards(output_prefix: str, shards: list[dict[str, Any]]) -> None:
    """Check that every complete shard of the progress file is still there, with the sizes it had.

    Raises:
        DataPrepareError: a shard file is missing or has another size (naming it, and --force).
    """
    for entry in shards:
        for key, counts in entry["keys"].items():
            prefix = shard_prefix(output_prefix, entry["index"], key)
            for ext, size in ((".bin", counts.get("bin_bytes")), (".idx", counts.get("idx_bytes"))):
                path = prefix + ext
                now = os.path.getsize(path) if os.path.isfile(path) else None
                if now != size:
                    what = "is missing" if now is None else f"has {now:,} bytes, not the {size:,} it was written with"
                    raise DataPrepareError(
                        f"--resume: {path}, a complete shard of the interrupted run, {what}; pass --force "
                        "(instead of --resume) to write every shard again"
                    )


def remove_extra_shards(output_prefix: str, keys: Sequence[str], count: int) -> list[str]:
    """After a ``--force`` run: remove the shards numbered ``count`` and up (an earlier, longer
    run's), with their records, so that a glob of the shards finds this run's only."""
    pattern = _shard_name_pattern(output_prefix, keys)
    removed = []
    for path in existing_outputs(output_prefix, keys):
        match = pattern.match(os.path.basename(path))
        if match and int(match.group(1)) >= count:
            remove_file(path)
            removed.append(path)
    return removed


def kept_outputs(output_prefix: str, keys: Sequence[str], shards: list[dict[str, Any]]) -> dict[str, DatasetOutput]:
    """Per key, the totals of ``shards`` (progress entries) as a :class:`DatasetOutput` whose
    ``prefix`` is the manifest's stem and whose paths are the shards' glob."""
    totals = {}
    for key in keys:
        out = DatasetOutput(json_key=key, prefix=dataset_prefix(output_prefix, key),
                            bin_path=f"{output_prefix}-*_{key}_document.bin",
                            idx_path=f"{output_prefix}-*_{key}_document.idx")
        for entry in shards:
            counts = entry["keys"][key]
            out.documents += counts["documents"]
            out.tokens += counts["tokens"]
            out.sequences += counts.get("sequences", 0)
            out.empty_documents += counts.get("empty_documents", 0)
        totals[key] = out
    return totals

