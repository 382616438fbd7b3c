"""Data blends: globs and manifests of shards (``data.train`` / ``data.valid``) resolved into
shards weighted by tokens, read from the ``.idx`` files and manifests on disk."""

from __future__ import annotations

import array
import functools
import glob
import os
import posixpath
import struct
import sys
from dataclasses import dataclass
from typing import Any

from dlmspec import files
from dlmspec.data.record import RecordError, read_record, record_path


#: ``kind`` of a sharded dataset's manifest (``PREFIX_KEY_document.manifest.json``, written by
#: ``dlmspec data prepare`` when its output is sharded).
MANIFEST_KIND = "dlmspec-dataset-manifest"
#: The manifest layouts this dlmspec reads.
MANIFEST_VERSIONS = (1,)
#: How a manifest's file name ends.
MANIFEST_SUFFIX = ".manifest.json"
#: Characters that make a ``data.train`` prefix a glob (:mod:`glob`'s wildcards).
GLOB_CHARS = frozenset("*?[")
#: An unfinished dataset of ``data prepare`` (``PREFIX.tmp-HOST-PID-HEX.bin/.idx``,
#: :mod:`dlmspec.data.outputs`): never matched by a glob.
_TMP_PART = ".tmp-"
#: The first bytes of a Megatron ``.idx`` file (megatron.core.datasets.indexed_dataset._INDEX_HEADER).
_INDEX_HEADER = b"MMIDIDX\x00\x00"
#: Sequence lengths (int32) read at a time from an ``.idx``.
_LENGTHS_PER_READ = 1 << 20
#: ``.idx`` header: 9 magic bytes, version (u64), dtype code (u8), sequences (u64), document indices (u64).
_INDEX_HEAD_BYTES = 34


def blend_kind(prefix: str) -> str:
    """What a ``data.train`` / ``data.valid`` entry names: ``"manifest"`` (its path ends with
    :data:`MANIFEST_SUFFIX`, a glob of manifests too), ``"glob"`` (it holds ``*``, ``?`` or ``[``)
    or ``"prefix"`` (one indexed dataset, ``PREFIX.bin`` / ``PREFIX.idx``, used as written)."""
    if prefix.endswith(MANIFEST_SUFFIX):
        return "manifest"
    return "glob" if GLOB_CHARS.intersection(prefix) else "prefix"


@dataclass(frozen=True)
class BlendProblem:
    """Why an entry of a blend cannot be resolved as written (the rules of
    :mod:`dlmspec.check.data` report these).

    Attributes:
        rule: the rule id (``data-glob-empty``, ``data-manifest-missing``,
            ``data-manifest-unreadable``, ``data-manifest-kind``, ``data-shard-missing``,
            ``data-index-unreadable``, ``data-manifest-tokens``, ``data-tokenizer-mixed``).
        key: ``"data.train"`` or ``"data.valid"``.
        entry: the entry's prefix as written (a glob, a manifest path).
        path: the file the problem is in (the manifest, a shard's ``.idx``), or the glob.
        message: why, in words.
        hint: a value or an action that works.
    """

    rule: str
    key: str
    entry: str
    path: str
    message: str
    hint: str


@dataclass(frozen=True)
class Shard:
    """One dataset of a resolved blend.

    Attributes:
        prefix: its path without ``.bin`` / ``.idx``.
        weight: its sampling weight (normalised with the others by megatron-core's builder).
        tokens: its tokens (from the manifest, else its ``.idx``); None for a plain prefix
            (not read) or an unreadable index.
        entry: the ``data.train`` entry it came from, as written.
    """

    prefix: str
    weight: float
    tokens: int | None
    entry: str


@dataclass(frozen=True)
class BlendResolution:
    """``data.train`` (or ``data.valid``) with its globs and manifests expanded.

    Attributes:
        shards: in blend order: each entry's shards in sorted path order, entries as written.
        problems: what kept an entry from resolving (:class:`BlendProblem`).
        expanded: whether any entry was a glob or a manifest. Without one, the shards are the
            entries themselves with their weights as written (no file is read).
    """

    shards: tuple[Shard, ...] = ()
    problems: tuple[BlendProblem, ...] = ()
    expanded: bool = False

    def pairs(self) -> list[tuple[str, float]]:
        """``[(prefix, weight), ...]``: megatron-core's blend (``BlendedMegatronDatasetConfig.blend``
        takes the prefixes and the weights, and normalises the weights itself)."""
        return [(s.prefix, s.weight) for s in self.shards]

    @property
    def tokens(self) -> int | None:
        """Tokens of every shard together; None unless every shard's count is known."""
        counts = [s.tokens for s in self.shards]
        return sum(counts) if counts and all(c is not None for c in counts) else None  # type: ignore[misc]


@functools.lru_cache(maxsize=4096)
def _index_counts_cached(path: str, size: int, mtime_ns: int) -> tuple[int, int] | str:
    del mtime_ns  # the cache key (with size): a rewritten file is read again
    try:
        with os.fdopen(files.open_regular(path, what="dataset index (.idx)"), "rb") as handle:
            head = handle.read(_INDEX_HEAD_BYTES)
            if len(head) < _INDEX_HEAD_BYTES or head[:9] != _INDEX_HEADER:
                return f"does not start with {_INDEX_HEADER!r} (not a Megatron index)"
            version, _code, sequences, doc_indices = struct.unpack("<QBQQ", head[9:])
            if version != 1:
                return f"index version {version} (megatron-core writes version 1)"
            expected = _INDEX_HEAD_BYTES + 12 * sequences + 8 * doc_indices
            if size not in (expected, expected + sequences) or doc_indices < 1:
                return (f"{size:,} bytes, but its header ({sequences:,} sequences, {doc_indices:,} document indices) "
                        f"needs {expected:,} (truncated or damaged)")
            tokens, left = 0, sequences
            while left:  # in pieces of 4 MiB: memory stays flat on a shard of many documents
                count = min(left, _LENGTHS_PER_READ)
                data = handle.read(4 * count)
                if len(data) < 4 * count:
                    return f"too short for its {sequences:,} sequences (a truncated copy?)"
                lengths = array.array("i")
                lengths.frombytes(data)
                if sys.byteorder == "big":
                    lengths.byteswap()
                if min(lengths) < 0:
                    return f"holds a negative sequence length ({min(lengths):,}): a damaged index"
                tokens += sum(lengths)
                left -= count
    except files.FileRefused as exc:
        return exc.why
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return tokens, max(0, doc_indices - 1)


def index_counts(prefix: str) -> tuple[int, int] | str:
    """``(tokens, documents)`` of the indexed dataset ``prefix``, read from ``PREFIX.idx`` without
    torch or numpy: the header's counts, then the sum of ``sequence_lengths`` (int32 after the
    34-byte header; megatron-core ``indexed_dataset._IndexReader``; ``document_indices`` holds one
    more entry than there are documents). The file must be a regular file of the size its header
    gives, with no negative length (the full check, with numpy, is
    :func:`dlmspec.data.index.check_index`). Cached by the file's size and modification time.

    Returns:
        The counts, or why the file cannot be read (a string).
    """
    path = prefix + ".idx"
    try:
        st = os.stat(path)
    except (OSError, ValueError) as exc:
        return f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
    return _index_counts_cached(path, st.st_size, st.st_mtime_ns)


def _exists(path: str) -> bool:
    try:
        return os.path.isfile(path)
    except (OSError, ValueError):
        return False


def _glob_shards(pattern: str) -> list[str]:
    """Sorted dataset prefixes whose ``.bin`` or ``.idx`` matches ``pattern`` (unfinished
    ``data prepare`` files left out)."""
    found = set()
    for ext in (".bin", ".idx"):
        for path in glob.glob(pattern + ext):
            prefix = path[: -len(ext)]
            if _TMP_PART not in os.path.basename(prefix):
                found.add(prefix)
    return sorted(found)


_Listed = tuple[str, "int | None", "int | None"]


def _read_manifest(path: str, key: str, entry: str) -> tuple[list[_Listed], list[BlendProblem]]:
    """``([(shard prefix, tokens, documents), ...], problems)`` of the manifest ``path`` (its
    counts; documents None where it gives none); shard paths are relative to its folder."""
    def problem(rule_id: str, message: str, hint: str) -> tuple[list[_Listed], list[BlendProblem]]:
        return [], [BlendProblem(rule_id, key, entry, path, message, hint)]

    rewrite = "write it again with `dlmspec data prepare` (it writes the manifest of a sharded output)"
    if not os.path.lexists(path):  # a FIFO or device is there, and refused by kind below
        return problem("data-manifest-missing", f"manifest {path!r} not found", "give the path of the "
                       f"*{MANIFEST_SUFFIX} that `dlmspec data prepare` wrote beside the shards (relative paths are "
                       "read from the directory dlmspec runs in), or a glob of the shards' prefixes")
    try:
        body = files.read_json(path, what="manifest")
    except files.FileRefused as exc:
        return problem("data-manifest-unreadable", f"manifest {path!r}: {exc.why}", rewrite)
    if not isinstance(body, dict) or body.get("kind") != MANIFEST_KIND:
        kind = body.get("kind") if isinstance(body, dict) else type(body).__name__
        return problem("data-manifest-kind", f"{path!r} is not a dataset manifest (its kind is {kind!r}, not "
                       f"{MANIFEST_KIND!r})", f"name a *{MANIFEST_SUFFIX} written by `dlmspec data prepare`")
    if body.get("version") not in MANIFEST_VERSIONS:
        return problem("data-manifest-kind", f"manifest {path!r} has version {body.get('version')!r}; this dlmspec "
                       f"reads version {', '.join(map(str, MANIFEST_VERSIONS))}", "upgrade dlmspec, or " + rewrite)
    shards = body.get("shards")
    if not isinstance(shards, list) or not shards:
        return problem("data-manifest-unreadable", f"manifest {path!r} lists no shards (its 'shards' is "
                       f"{shards!r:.60})", rewrite)
    folder = os.path.dirname(path)
    out: list[_Listed] = []
    first_at: dict[str, int] = {}  # shard prefix -> its first index (a shard listed twice would be read twice)
    for i, shard in enumerate(shards):
        rel = shard.get("path") if isinstance(shard, dict) else None
        tokens = shard.get("tokens") if isinstance(shard, dict) else None
        documents = shard.get("documents") if isinstance(shard, dict) else None
        if not isinstance(rel, str) or not rel or not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            return problem("data-manifest-unreadable", f"manifest {path!r}: shards[{i}] is not "
                           "{\"path\": \"<prefix>\", \"tokens\": <count>, ...} (got " + f"{shard!r:.80})", rewrite)
        if documents is not None and (not isinstance(documents, int) or isinstance(documents, bool) or documents < 0):
            return problem("data-manifest-unreadable", f"manifest {path!r}: shards[{i}].documents is "
                           f"{documents!r:.40}, not a count", rewrite)
        prefix = posixpath.normpath(posixpath.join(folder, rel))
        if first_at.setdefault(prefix, i) != i:
            return problem("data-manifest-unreadable", f"manifest {path!r}: shards[{i}] lists {rel!r} again "
                           f"(shards[{first_at[prefix]}] is the same shard), so the blend would read it twice",
                           rewrite)
        out.append((prefix, tokens, documents))
    return out, []


def _tokenizer_identity(prefix: str) -> tuple[Any, ...] | None:
    """What tells the tokenizer a dataset was written with apart, from its record
    (:mod:`dlmspec.data.record`): type, vocabulary size, EOD id and each file's SHA-256 (its
    path where no hash was recorded); None without a readable record."""
    from dlmspec.data.record import RecordError, read_record, record_path

    try:
        record = read_record(prefix)
    except (RecordError, OSError):
        return None
    tok = record.get("tokenizer") if isinstance(record, dict) else None
    if not isinstance(tok, dict):
        return None
    files = tok.get("files") if isinstance(tok.get("files"), dict) else {}
    marks = tuple(sorted((str(k), str(v.get("sha256") or v.get("path")) if isinstance(v, dict) else str(v))
                         for k, v in files.items()))
    return (tok.get("type"), tok.get("vocab_size"), tok.get("eod_id"), marks)


def _describe_tokenizer(identity: tuple[Any, ...]) -> str:
    kind, size, eod, _files = identity
    return f"{kind} (vocab_size {size}, eod_id {eod})"


def resolve_blend(entries: Any, key: str = "data.train") -> BlendResolution:
    """Expand the globs and manifests of a blend (``spec.data.train`` or ``spec.data.valid``).

    Each entry is a prefix used as written, a glob of prefixes (matched against ``PREFIX.bin`` /
    ``PREFIX.idx``, relative to the current directory, as the job opens them) or a manifest
    (:data:`MANIFEST_KIND`; a glob of manifests too). An expanded entry's weight is its group's
    share, split over its shards in proportion to their tokens (the manifest's counts, else each
    ``.idx``'s, :func:`index_counts`); shards without tokens are left out (megatron-core samples a
    dataset by its weight, and an empty one has nothing to give). When any entry was expanded the
    weights are normalised to sum to 1 (megatron-core's builder normalises them anyway:
    ``megatron.core.datasets.utils.normalize``); a blend of plain prefixes is returned as written.
    Deterministic: the same files give the same shards, in the same order, with the same weights.
    Never raises: what cannot be resolved is a :class:`BlendProblem`.

    Args:
        entries: the blend's entries (objects with ``prefix`` and ``weight``).
        key: the spec key the problems name.
    """
    shards: list[Shard] = []
    problems: list[BlendProblem] = []
    expanded = False
    for entry in entries:
        written, share = str(entry.prefix), float(entry.weight)
        kind = blend_kind(written)
        if kind == "prefix":
            shards.append(Shard(written, share, None, written))
            continue
        expanded = True
        before = len(problems)
        found: list[_Listed] = []
        if kind == "manifest":
            paths = sorted(glob.glob(written)) if GLOB_CHARS.intersection(written) else [written]
            if not paths:
                problems.append(BlendProblem("data-glob-empty", key, written, written, f"{written!r} matches no "
                                             "manifest", "check the pattern (relative paths are read from the "
                                             "directory dlmspec runs in), or name the manifest itself"))
            for path in paths:
                listed, bad = _read_manifest(path, key, written)
                problems.extend(bad)
                found.extend(listed)
        else:
            found = [(p, None, None) for p in _glob_shards(written)]
            if not found:
                problems.append(BlendProblem(
                    "data-glob-empty", key, written, written, f"the glob {written!r} matches no dataset "
                    "(no PATTERN.bin / PATTERN.idx)", "check the pattern against the prefixes `dlmspec data "
                    "prepare` wrote (e.g. 'data/web-*_text_document' for data/web-00000_text_document.bin/.idx; "
                    "relative paths are read from the directory dlmspec runs in); a prefix whose name holds "
                    "*, ? or [ is written with them in brackets: [*], [?], [[]"))
        group: list[tuple[str, int | None]] = []
        looked: dict[str, tuple[list[str], tuple[int, int] | str]] = {}  # a shard listed again: its files once
        for prefix, listed, listed_docs in found:
            if prefix not in looked:
                gone = [prefix + ext for ext in (".bin", ".idx") if not _exists(prefix + ext)]
                looked[prefix] = (gone, "" if gone else index_counts(prefix))
            missing, counts = looked[prefix]
            if missing:
                problems.append(BlendProblem(
                    "data-shard-missing", key, written, missing[0], f"shard {prefix!r} of {written!r} has no "
                    f"{' or '.join(os.path.basename(m) for m in missing)}", "finish or re-run `dlmspec data prepare` "
                    "(an interrupted run resumes and writes the missing shards), or remove the shard from the "
                    "manifest"))
                continue
            if isinstance(counts, str):
                problems.append(BlendProblem("data-index-unreadable", key, written, prefix + ".idx",
                                             f"{prefix + '.idx'!r} {counts}", "write the shard again with `dlmspec "
                                             "data prepare`"))
                continue
            said = [f"{n:,} {what} (its .idx: {real:,})" for n, real, what in
                    ((listed, counts[0], "tokens"), (listed_docs, counts[1], "documents")) if n is not None and n != real]
            if said:
                problems.append(BlendProblem(
                    "data-manifest-tokens", key, written, prefix + ".idx", f"the manifest says shard {prefix!r} "
                    f"holds {' and '.join(said)}: the manifest is stale or the shard was replaced",
                    "write the dataset and its manifest again with `dlmspec data prepare` (the blend's weights "
                    "come from the manifest's token counts)"))
            group.append((prefix, listed if listed is not None else counts[0]))
        total = sum(t for _, t in group if t is not None)
        if group and not total and len(problems) == before:
            problems.append(BlendProblem("data-glob-empty", key, written, written, f"{written!r} names only empty "
                                         f"datasets ({len(group)}, 0 tokens)", "prepare the data again, or name "
                                         "datasets that hold tokens"))
        for prefix, tokens in group:
            if tokens:
                shards.append(Shard(prefix, share * tokens / total, tokens, written))
    if expanded:
        weight = sum(s.weight for s in shards)
        if weight > 0:
            shards = [Shard(s.prefix, s.weight / weight, s.tokens, s.entry) for s in shards]
    return BlendResolution(tuple(shards), tuple(problems), expanded)


def mixed_tokenizers(key_shards: list[tuple[str, BlendResolution]]) -> list[BlendProblem]:
    """A :class:`BlendProblem` (rule ``data-tokenizer-mixed``) per blend whose datasets' records
    (:mod:`dlmspec.data.record`) name another tokenizer than its first dataset with a record
    (train and valid compared as one: they feed one model). Datasets without a record are not
    compared."""
    first: tuple[str, tuple[Any, ...]] | None = None
    out: list[BlendProblem] = []
    identities: dict[str, tuple[Any, ...] | None] = {}  # each dataset's record read once
    for key, resolution in key_shards:
        for shard in resolution.shards:
            if shard.prefix not in identities:
                identities[shard.prefix] = _tokenizer_identity(shard.prefix)
            identity = identities[shard.prefix]
            if identity is None:
                continue
            if first is None:
                first = (shard.prefix, identity)
            elif identity != first[1]:
                out.append(BlendProblem(
                    "data-tokenizer-mixed", key, shard.entry, record_path(shard.prefix),
                    f"{shard.prefix!r} was written by {_describe_tokenizer(identity)}, {first[0]!r} by "
                    f"{_describe_tokenizer(first[1])}" + ("" if identity[:3] != first[1][:3] else
                                                          " (the same type with other files)") +
                    ": their ids mean other tokens", "prepare every dataset of the run with the spec's tokenizer "
                    "(`dlmspec data prepare` with the same tokenizer files), or remove the other ones"))
                break  # one per blend
    return out


def record_mean(prefix: str) -> tuple[float | None, float | None, str]:
    """``(mean conversation tokens, response fraction, note)`` of dataset ``prefix`` from its
    record; ``(None, None, why)`` when it has no usable record."""
    try:
        rec = read_record(prefix)
    except RecordError as exc:
        return None, None, f"{prefix}: record unreadable ({exc.reason})"
    if rec is None:
        return None, None, f"{prefix}: no dataset record ({record_path(prefix)})"
    sft = rec.get("sft") if isinstance(rec.get("sft"), dict) else {}
    resp, prompt = sft.get("response_tokens"), sft.get("prompt_tokens")
    frac = None
    if isinstance(resp, (int, float)) and isinstance(prompt, (int, float)) and resp + prompt > 0:
        frac = float(resp) / float(resp + prompt)
    docs, tokens = rec.get("documents"), rec.get("tokens")
    if isinstance(docs, (int, float)) and isinstance(tokens, (int, float)) and docs > 0:
        mean = float(tokens) / float(docs)
    else:
        written = (sft.get("rows") or {}).get("written") if isinstance(sft.get("rows"), dict) else None
        if frac is None or not isinstance(written, (int, float)) or written <= 0:
            return None, None, f"{prefix}: its record has no token or document counts"
        mean = float(resp + prompt) / float(written)
    return mean, frac, f"{prefix}: mean {mean:,.0f} tokens per conversation (its record)"


def record_means(blend: BlendResolution) -> tuple[tuple[str, float | None, float | None, str], ...]:
    """``(prefix, mean conversation tokens, response fraction, note)`` of each shard of ``blend``
    (:func:`record_mean`), as the SFT plan reads them (:func:`dlmspec.plan.sft.sft_plan`)."""
    return tuple((prefix, *record_mean(prefix)) for prefix, _ in blend.pairs())
