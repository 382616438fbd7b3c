"""``dlmspec data inspect PREFIX``: what a Megatron indexed dataset (``PREFIX.bin`` +
``PREFIX.idx``) holds, so a user can check it before a run: documents, sequences, tokens, the
token dtype, a histogram of document lengths, a decoded sample, and the tokenizer it was written
with (its record, ``PREFIX.dlmspec.json``, :mod:`dlmspec.data.record`; each tokenizer file's
SHA-256 compared with the file there now).

The ``.idx`` is read here with numpy (megatron-core's ``_IndexReader`` layout: the
``MMIDIDX`` header, version 1, the dtype code, the sequence and document counts, then
``sequence_lengths`` int32, ``sequence_pointers`` int64, ``document_indices`` int64), so only the
sample's decoding builds a tokenizer (:func:`dlmspec.tokenizers.build_tokenizer`). A dataset
without a record (Megatron-LM's ``preprocess_data.py``, or dlmspec before records) is shown with
ids only. User-input problems raise :class:`~dlmspec.data.errors.DataPrepareError`.
"""

from __future__ import annotations

import glob
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from dlmspec.data.errors import DataPrepareError
from dlmspec.data.index import DTYPE_CODES, INDEX_HEADER, IndexFacts, check_index  # noqa: F401 (re-exported)
from dlmspec.data.record import RecordError, file_sha256, read_record, record_path
from dlmspec.data.shards import MANIFEST_KIND, MANIFEST_SUFFIX, MANIFEST_VERSION
from dlmspec.files import FileRefused, read_json

#: Tokens of the decoded sample, by default.
SAMPLE_TOKENS = 64
#: Around each loss-carrying span of an SFT sample's decoded text (plain text: readable in a log,
#: a pipe or ``--json``; the table colours the spans as well).
LOSS_OPEN, LOSS_CLOSE = "[[", "]]"


@dataclass
class Inspection:
    """What :func:`inspect_dataset` found; ``to_dict()`` is the ``--json`` result.

    ``histogram``: ``{"min": lo, "max": hi, "documents": n}`` per power-of-two bucket of document
    lengths in tokens (``lo <= length <= hi``; an empty document is the bucket 0..0).
    ``tokenizer``: the record's tokenizer section plus ``files_match`` (every recorded file is
    there with the recorded SHA-256), or ``None`` without a record. ``sample``: ``document``,
    ``ids`` (its first tokens), ``text`` (decoded, ``None`` when the tokenizer is unknown or
    cannot be built; ``notes`` says why). ``shards``: for a sharded output (its manifest), each
    shard's ``prefix``, ``documents`` and ``tokens``, in order (``prefix`` is then the manifest's
    path and ``record`` None); None for one dataset.

    An SFT dataset (its record has an ``"sft"`` section and ``PREFIX_response.{bin,idx}`` lies beside
    it: :mod:`dlmspec.data.sft`) adds ``response``: ``tokens`` (loss-carrying tokens in the dataset),
    ``share`` (of all tokens), and the sample gains ``response`` (one 0/1 flag per sample id: 1
    carries loss) and ``marked`` (the decoded sample with each loss-carrying span between
    :data:`LOSS_OPEN` and :data:`LOSS_CLOSE`; ``None`` when the sample is not decoded). None for
    pre-training data."""

    prefix: str
    dtype: str
    documents: int
    sequences: int
    tokens: int
    empty_documents: int
    max_document_tokens: int
    mean_document_tokens: float
    histogram: list[dict[str, int]]
    tokenizer: Optional[dict[str, Any]]
    sample: dict[str, Any]
    record: Optional[dict[str, Any]] = None
    notes: list[str] = field(default_factory=list)
    shards: Optional[list[dict[str, Any]]] = None
    response: Optional[dict[str, Any]] = None

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` result, every token-shaped secret read from the record or manifest (a
        file path holding ``hf_...``) replaced by ``<hidden>`` (:func:`dlmspec.credentials.redact`)."""
        from dlmspec.credentials import redact

        data = asdict(self)
        data["mean_document_tokens"] = round(self.mean_document_tokens, 2)
        return redact(data)


def resolve_prefix(name: str) -> str:
    """The dataset prefix ``name`` means: itself; without a trailing ``.bin``/``.idx``; or
    ``data prepare``'s ``--output-prefix`` when it wrote one dataset there
    (``NAME_KEY_document``).

    Raises:
        DataPrepareError: no dataset there (the message lists the ones an output prefix has).
    """
    for ext in (".bin", ".idx"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    if os.path.isfile(name + ".idx"):
        return name
    found = sorted(p[: -len(".idx")] for p in glob.glob(glob.escape(name) + "_*_document.idx"))
    if len(found) == 1:
        return found[0]
    if found:
        raise DataPrepareError(
            f"{name}: an output prefix of several datasets; inspect one of them: {', '.join(found)}"
        )
    raise DataPrepareError(
        f"{name}: no dataset there ({name}.idx not found); pass the prefix of a .bin/.idx pair, e.g. "
        "the PREFIX_text_document that `dlmspec data prepare --output-prefix PREFIX` wrote"
    )


def resolve_manifest(name: str) -> Optional[str]:
    """The manifest of a sharded ``data prepare`` output ``name`` means, or None: ``name`` itself
    when it ends in ``.manifest.json``; ``NAME.manifest.json`` (the manifest's prefix,
    ``PREFIX_KEY_document``); or, for an ``--output-prefix`` with no dataset of its own, its one
    ``NAME_*_document.manifest.json``.

    Raises:
        DataPrepareError: a ``.manifest.json`` that is not there; an output prefix of several
            manifests (the message lists them).
    """
    if name.endswith(MANIFEST_SUFFIX):
        if not os.path.isfile(name):
            raise DataPrepareError(f"{name}: not found; pass the *.manifest.json that `dlmspec data prepare "
                                   "--shard-size` wrote beside the shards, or one shard's prefix")
        return name
    if os.path.isfile(name + MANIFEST_SUFFIX):
        return name + MANIFEST_SUFFIX
    if os.path.isfile(name + ".idx") or glob.glob(glob.escape(name) + "_*_document.idx"):
        return None
    found = sorted(glob.glob(glob.escape(name) + "_*_document" + MANIFEST_SUFFIX))
    if len(found) > 1:
        raise DataPrepareError(f"{name}: an output prefix of several sharded datasets; inspect one of their "
                               f"manifests: {', '.join(found)}")
    return found[0] if found else None


def manifest_shards(path: str) -> tuple[dict[str, Any], list[str]]:
    """``(manifest, shard prefixes in order)`` of a manifest (paths relative to its folder).

    Raises:
        DataPrepareError: not a regular file, too large or deep, not JSON, another kind or
            version, no list of shards with paths.
    """
    try:
        manifest = read_json(path, what="dataset manifest")
    except FileRefused as exc:
        raise DataPrepareError(str(exc)) from None
    if not isinstance(manifest, dict) or manifest.get("kind") != MANIFEST_KIND:
        kind = manifest.get("kind") if isinstance(manifest, dict) else None
        raise DataPrepareError(f"{path}: not a dataset manifest (its kind is {kind!r}, not {MANIFEST_KIND!r}); "
                               "pass a *.manifest.json that `dlmspec data prepare --shard-size` wrote")
    if manifest.get("version") != MANIFEST_VERSION:
        raise DataPrepareError(f"{path}: manifest version {manifest.get('version')!r:.40}, this dlmspec reads "
                               f"version {MANIFEST_VERSION}")
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not all(isinstance(e, dict) and isinstance(e.get("path"), str)
                                               and e.get("path") for e in shards):
        raise DataPrepareError(f"{path}: its \"shards\" is not a list of {{\"path\": ...}}; prepare it again")
    folder = os.path.dirname(path)
    return manifest, [os.path.normpath(os.path.join(folder, e["path"])) for e in shards]


def read_index(prefix: str) -> tuple[str, Any, Any, Any]:
    """``(dtype name, sequence_lengths, sequence_pointers, document_indices)`` of ``PREFIX.idx``
    (numpy arrays, memory-mapped), checked for consistency with itself and ``PREFIX.bin`` by
    :func:`dlmspec.data.index.check_index`.

    Raises:
        DataPrepareError: not a regular file, not a Megatron index, or an inconsistent one (the
            message names the file, the entry, why and the fix).
    """
    facts = _check(prefix)
    return facts.dtype, facts.sequence_lengths, facts.sequence_pointers, facts.document_indices


def _check(prefix: str) -> IndexFacts:
    try:
        return check_index(prefix)
    except FileRefused as exc:
        raise DataPrepareError(str(exc)) from None


def _histogram(doc_lengths: Any) -> list[dict[str, int]]:
    """Documents per power-of-two bucket of length (0, 1, 2-3, 4-7, ...)."""
    import numpy as np

    if len(doc_lengths) == 0:
        return []
    buckets = np.where(doc_lengths > 0, np.floor(np.log2(np.maximum(doc_lengths, 1))).astype(np.int64) + 1, 0)
    counts = np.bincount(buckets)
    rows = []
    for b, n in enumerate(counts.tolist()):
        if n:
            lo, hi = (0, 0) if b == 0 else (2 ** (b - 1), 2**b - 1)
            rows.append({"min": lo, "max": hi, "documents": int(n)})
    return rows


def _tokenizer_state(record: dict[str, Any] | None, notes: list[str]) -> dict[str, Any] | None:
    """The record's tokenizer section with ``files_match``; notes name a missing or changed file."""
    if record is None or not isinstance(record.get("tokenizer"), dict):
        return None
    section = dict(record["tokenizer"])
    match = True
    for key, entry in sorted((section.get("files") or {}).items()):
        path = entry.get("path") if isinstance(entry, dict) else None
        if not path or not os.path.isfile(path):
            if path and entry.get("sha256"):  # a hub name has no file and no digest
                notes.append(f"tokenizer {key} {path} is not there now: the sample is not decoded")
                match = False
            continue
        try:
            same = file_sha256(path) == entry.get("sha256")
        except OSError:
            same = False
        if not same:
            notes.append(f"tokenizer {key} {path} has changed since the dataset was written (SHA-256 differs): "
                         "the sample is not decoded")
            match = False
    section["files_match"] = match
    return section


def _decode(section: dict[str, Any] | None, ids: list[int], notes: list[str],
            special: dict[int, str] | None = None) -> str | None:
    """The sample's text with the recorded tokenizer; None (and a note) when it cannot be built.
    ``special`` maps the chat tokens an SFT record gave ids past the vocabulary to their text
    (``<|im_start|>``), which the tokenizer cannot decode."""
    if section is None:
        notes.append("no dataset record (written by Megatron-LM's preprocess_data.py or an older dlmspec): "
                     "the tokenizer is unknown, the sample is shown as ids")
        return None
    if not section.get("files_match"):
        return None
    from dlmspec.tokenizers import TokenizerError, build_tokenizer

    kind = str(section.get("type"))
    files = {k: v.get("path") for k, v in (section.get("files") or {}).items() if isinstance(v, dict)}
    size = section.get("vocab_size")
    vocab_size = None
    if kind in ("NullTokenizer", "NullMultimodalTokenizer") and isinstance(size, int):
        vocab_size = size - 1
    elif kind == "TikTokenizer" and isinstance(size, int):
        vocab_size = size
    try:
        tokenizer = build_tokenizer(kind, tokenizer_model=files.get("tokenizer_model"),
                                    vocab_file=files.get("vocab_file"), merge_file=files.get("merge_file"),
                                    vocab_size=vocab_size)
        if not special:
            return str(tokenizer.detokenize(ids))
        parts: list[str] = []
        run: list[int] = []
        for i in ids:
            if i in special:
                if run:
                    parts.append(str(tokenizer.detokenize(run)))
                    run = []
                parts.append(special[i])
            else:
                run.append(i)
        if run:
            parts.append(str(tokenizer.detokenize(run)))
        return "".join(parts)
    except (TokenizerError, ImportError) as exc:
        notes.append(f"the recorded tokenizer {kind} cannot be built here ({exc}): the sample is shown as ids")
    except Exception as exc:  # a tokenizer library's own decoding error: ids only
        notes.append(f"{kind} cannot decode the sample ({type(exc).__name__}: {exc})")
    return None


def _marked(section: dict[str, Any] | None, ids: list[int], flags: list[int], notes: list[str],
            special: dict[int, str] | None = None) -> str | None:
    """The sample's text with each maximal run of loss-carrying ids (``flags`` 1) decoded on its own
    and put between :data:`LOSS_OPEN` and :data:`LOSS_CLOSE`; the runs between them decoded on
    their own too (so a byte-level BPE token cut at a run's edge may show as a replacement
    character). None when the sample cannot be decoded (:func:`_decode` says why in ``notes``)."""
    if not ids or len(flags) != len(ids):
        return None
    parts: list[str] = []
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or flags[end] != flags[start]:
            quiet: list[str] = []
            text = _decode(section, ids[start:end], quiet, special)
            if text is None:
                notes.extend(n for n in quiet if n not in notes)
                return None
            parts.append(f"{LOSS_OPEN}{text}{LOSS_CLOSE}" if flags[start] else text)
            start = end
    return "".join(parts)


def _response_flags(prefix: str, record: Optional[dict[str, Any]], sample_document: int, sample_tokens: int,
                    tokens: int, documents: int, notes: list[str]) -> tuple[Optional[dict[str, Any]], list[int]]:
    """``(summary, sample flags)`` of an SFT dataset's response mask ``PREFIX_response``
    (:data:`dlmspec.data.sft.RESPONSE_SUFFIX`): the loss-carrying tokens and their share of
    ``tokens``, and the 0/1 flag of each of the sample's first ``sample_tokens`` ids. ``(None, [])``
    for a dataset without an ``"sft"`` record section; a missing or mismatched mask is a note."""
    import numpy as np

    from dlmspec.data.sft import RESPONSE_SUFFIX

    if not isinstance(record, dict) or not isinstance(record.get("sft"), dict):
        return None, []
    mask_prefix = prefix + RESPONSE_SUFFIX
    if not (os.path.isfile(mask_prefix + ".idx") and os.path.isfile(mask_prefix + ".bin")):
        notes.append(f"SFT data without its response mask ({mask_prefix}.bin/.idx not found): "
                     "the tokens that carry loss are not shown")
        return None, []
    try:
        dtype, lengths, pointers, doc_indices, bin_path = _read_dataset(mask_prefix)
    except DataPrepareError as exc:
        notes.append(f"the response mask cannot be read ({exc}): the tokens that carry loss are not shown")
        return None, []
    doc_lengths = _document_lengths(lengths, doc_indices)
    if int(lengths.sum(dtype=np.int64)) != tokens or len(doc_lengths) != documents:
        notes.append(f"the response mask {mask_prefix} does not match the tokens (other lengths): "
                     "prepare the dataset again; the tokens that carry loss are not shown")
        return None, []
    try:
        values = _map_tokens(bin_path, dtype, 0, tokens) if tokens else np.zeros(0, np.uint8)
    except DataPrepareError as exc:
        notes.append(f"{exc}: the tokens that carry loss are not shown")
        return None, []
    carried = int(np.count_nonzero(values))
    flags = _sample_ids(dtype, pointers, doc_indices, doc_lengths, bin_path, sample_document, sample_tokens) \
        if documents else []
    summary = {"tokens": carried, "share": carried / tokens if tokens else 0.0, "prefix": mask_prefix,
               "open": LOSS_OPEN, "close": LOSS_CLOSE}
    return summary, [1 if f else 0 for f in flags]


def _read_dataset(prefix: str) -> tuple[str, Any, Any, Any, str]:
    """``(dtype, sequence_lengths, sequence_pointers, document start indices, .bin path)`` of
    ``PREFIX`` with the index checked against itself and its ``.bin``
    (:func:`dlmspec.data.index.check_index`); document ``i`` spans sequences ``docs[i]..docs[i+1]``.

    Raises:
        DataPrepareError: not an index, an inconsistent one, no ``.bin``, a ``.bin`` shorter than
            the index says.
    """
    import numpy as np

    facts = _check(prefix)
    return (facts.dtype, facts.sequence_lengths, facts.sequence_pointers,
            np.asarray(facts.document_indices, dtype=np.int64), facts.bin_path)


def _document_lengths(lengths: Any, doc_indices: Any) -> Any:
    """Tokens per document (numpy int64) from sequence lengths and document start indices."""
    import numpy as np

    starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    if len(doc_indices) > 1:
        return starts[doc_indices[1:]] - starts[doc_indices[:-1]]
    return np.zeros(0, np.int64)


def _sample_ids(dtype: str, pointers: Any, doc_indices: Any, doc_lengths: Any, bin_path: str,
                document: int, sample_tokens: int) -> list[int]:
    """The first ``sample_tokens`` ids of ``document`` (0-based, of this dataset)."""
    import numpy as np

    first = int(doc_indices[document])
    count = min(int(doc_lengths[document]), int(sample_tokens))
    if not count:
        return []
    itemsize = np.dtype(dtype).itemsize
    offset = int(pointers[first]) // itemsize
    return [int(x) for x in _map_tokens(bin_path, dtype, offset, count)]


def _map_tokens(bin_path: str, dtype: str, offset: int, count: int) -> Any:
    """Tokens ``offset .. offset + count`` (in items of ``dtype``) of ``bin_path``, memory-mapped:
    only that window is mapped (``np.memmap``'s ``offset``/``shape``), never the whole ``.bin``,
    which may be far larger than the memory this process may use (a sparse 8 GiB file under a
    2 GiB address-space limit). :func:`dlmspec.data.index.check_index` has checked that the
    ``.bin`` holds every token its index describes.

    Raises:
        DataPrepareError: the window cannot be mapped (``ENOMEM`` under an address-space limit, a
            file that shrank since it was checked): the message names the file and why.
    """
    import numpy as np

    itemsize = np.dtype(dtype).itemsize
    try:
        return np.memmap(bin_path, mode="r", dtype=np.dtype(dtype), offset=offset * itemsize, shape=(count,))
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise DataPrepareError(
            f"{bin_path}: cannot be mapped in the memory this process may use ({count * itemsize:,} bytes at byte "
            f"{offset * itemsize:,}: {why}); raise the limit (ulimit -v) or inspect on a machine with more memory"
        ) from None


def _finish(prefix: str, dtype: str, sequences: int, tokens: int, doc_lengths: Any, ids: list[int],
            sample_document: int, record: Optional[dict[str, Any]], tokenizer: Optional[dict[str, Any]],
            decode: bool, notes: list[str], shards: Optional[list[dict[str, Any]]] = None,
            response: Optional[dict[str, Any]] = None, flags: Optional[list[int]] = None) -> Inspection:
    """The :class:`Inspection` of counted documents: the tokenizer's state, the decoded sample."""
    documents = len(doc_lengths)
    section = _tokenizer_state({"tokenizer": tokenizer} if tokenizer is not None else None, notes)
    sft = (record or {}).get("sft") if isinstance(record, dict) else None
    special = {int(i): str(t) for t, i in ((sft or {}).get("special_tokens") or {}).items() if isinstance(i, int)}
    if special:
        notes.append("SFT data (chat template {!r}): chat tokens {} were given ids past the vocabulary".format(
            (sft or {}).get("chat_template"), ", ".join(f"{t} = {i}" for i, t in sorted(special.items()))))
    text = _decode(section, ids, notes, special) if decode and ids else None
    sample: dict[str, Any] = {"document": sample_document if documents else None, "ids": ids, "text": text}
    if response is not None:
        flags = list(flags or [])
        sample["response"] = flags
        sample["response_tokens"] = sum(flags)
        sample["marked"] = _marked(section, ids, flags, [], special) if text is not None else None
    return Inspection(
        prefix=prefix, dtype=dtype, documents=documents, sequences=sequences, tokens=tokens,
        empty_documents=int((doc_lengths == 0).sum()), max_document_tokens=int(doc_lengths.max(initial=0)),
        mean_document_tokens=float(doc_lengths.mean()) if documents else 0.0,
        histogram=_histogram(doc_lengths), tokenizer=section,
        sample=sample, record=record, notes=notes, shards=shards, response=response,
    )


def _inspect_manifest(path: str, sample_document: int, sample_tokens: int, decode: bool) -> Inspection:
    """A sharded output as one dataset: every shard of the manifest at ``path``, in order."""
    import numpy as np

    manifest, prefixes = manifest_shards(path)
    dtypes: set[str] = set()
    all_lengths: list[Any] = []
    shards: list[dict[str, Any]] = []
    sequences = tokens = 0
    ids: list[int] = []
    offset = 0  # documents of the shards before this one
    for prefix in prefixes:
        if not (os.path.isfile(prefix + ".idx") and os.path.isfile(prefix + ".bin")):
            raise DataPrepareError(f"{path}: its shard {prefix} has no .bin/.idx there (moved or removed?); "
                                   "restore it, or prepare the dataset again")
        dtype, lengths, pointers, doc_indices, bin_path = _read_dataset(prefix)
        dtypes.add(dtype)
        doc_lengths = _document_lengths(lengths, doc_indices)
        count = int(lengths.sum(dtype=np.int64))
        if offset <= sample_document < offset + len(doc_lengths):
            ids = _sample_ids(dtype, pointers, doc_indices, doc_lengths, bin_path, sample_document - offset,
                              sample_tokens)
        offset += len(doc_lengths)
        all_lengths.append(doc_lengths)
        sequences += int(len(lengths))
        tokens += count
        shards.append({"prefix": prefix, "documents": int(len(doc_lengths)), "tokens": count})
    documents = offset
    if documents and not 0 <= sample_document < documents:
        raise DataPrepareError(f"--sample-document {sample_document}: the dataset has documents 0..{documents - 1}")
    if len(dtypes) > 1:
        raise DataPrepareError(f"{path}: its shards hold ids of several dtypes ({', '.join(sorted(dtypes))}); "
                               "prepare the dataset again")
    notes: list[str] = []
    if isinstance(manifest.get("tokens"), int) and manifest["tokens"] != tokens:
        notes.append(f"the manifest says {manifest['tokens']:,} tokens, the shards' indexes {tokens:,}: "
                     "the manifest is stale")
    tokenizer = manifest.get("tokenizer") if isinstance(manifest.get("tokenizer"), dict) else None
    doc_lengths = np.concatenate(all_lengths) if all_lengths else np.zeros(0, np.int64)
    return _finish(path, dtypes.pop() if dtypes else "uint16", sequences, tokens, doc_lengths, ids,
                   sample_document, None, tokenizer, decode, notes, shards)


def inspect_dataset(name: str, *, sample_document: int = 0, sample_tokens: int = SAMPLE_TOKENS,
                    decode: bool = True) -> Inspection:
    """Read a dataset's index, record and a sample (see :class:`Inspection`).

    Args:
        name: the dataset prefix (or its ``.bin``/``.idx`` name, or a one-dataset ``--output-prefix``),
            or a sharded output: its ``*.manifest.json``, the manifest's prefix or its
            ``--output-prefix`` (:func:`resolve_manifest`), inspected as one dataset of all shards.
        sample_document: the document shown (0-based).
        sample_tokens: how many of its first tokens are shown (and decoded).
        decode: build the recorded tokenizer to decode the sample.

    Raises:
        DataPrepareError: no dataset, not an index, a ``.bin`` shorter than the index says, a bad
            record or manifest, a manifest's shard missing, ``sample_document`` out of range or
            ``sample_tokens`` < 1.
    """
    import numpy as np

    if sample_tokens < 1:
        raise DataPrepareError(f"--sample-tokens must be at least 1, got {sample_tokens}")
    manifest = resolve_manifest(name)
    if manifest is not None:
        return _inspect_manifest(manifest, sample_document, sample_tokens, decode)
    prefix = resolve_prefix(name)
    dtype, lengths, pointers, doc_indices, bin_path = _read_dataset(prefix)
    tokens = int(lengths.sum(dtype=np.int64))
    doc_lengths = _document_lengths(lengths, doc_indices)
    documents = len(doc_lengths)
    notes: list[str] = []
    try:
        record = read_record(prefix)
    except RecordError as exc:
        raise DataPrepareError(f"{record_path(prefix)}: {exc.reason}; move it away to inspect the data alone") from None
    if documents and not 0 <= sample_document < documents:
        raise DataPrepareError(f"--sample-document {sample_document}: the dataset has documents 0..{documents - 1}")
    ids = _sample_ids(dtype, pointers, doc_indices, doc_lengths, bin_path, sample_document, sample_tokens) \
        if documents else []
    if record is not None and isinstance(record.get("tokens"), int) and record["tokens"] != tokens:
        notes.append(f"the record says {record['tokens']:,} tokens, the index {tokens:,}: the record is stale")
    tokenizer = record.get("tokenizer") if isinstance(record, dict) and isinstance(record.get("tokenizer"), dict) \
        else None
    response, flags = _response_flags(prefix, record, sample_document, sample_tokens, tokens, documents, notes)
    return _finish(prefix, dtype, int(len(lengths)), tokens, doc_lengths, ids, sample_document, record, tokenizer,
                   decode, notes, response=response, flags=flags)
