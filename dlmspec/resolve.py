"""The resolved spec: every value a later stage needs, derived once.

``spec -> Resolved -> plan -> rendered files``: :func:`resolve` fills what the user may leave
unset (query groups, head dimension, expert TP, attention mask, mask token, train_iters, the
layer path of ``transformer_impl = "auto"``) and
derives what the user never writes (data-parallel size, microbatches per step, padded
vocabulary, parameter counts). Later stages read a :class:`Resolved`, never the raw spec's
defaults, so each rule about a default lives here only.

:func:`resolve` never raises for cross-field problems (it clamps with ``max(1, ...)`` so the
validator can still run on a broken spec); the rules of :mod:`dlmspec.check` report them.
Derived values the runtime and the launch scripts read (the run directory, the end-of-document
id, the SLURM job name and settings) are functions of the spec here too.
"""

from __future__ import annotations

import array
import functools
import glob
import math
import os
import posixpath
import struct
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlmspec import files
from dlmspec.gpus import GPU, GPUS
from dlmspec.layout import data_parallel_size, derive as derive_layout
from dlmspec.params import ParamCounts, count_parameters, moe_layer_pattern
from dlmspec.spec.fast import section_defaults
from dlmspec.spec.presets import MASK_TOKEN_IDS
from dlmspec.tokenizers import TokenizerFacts, read_json, tokenizer_facts

if TYPE_CHECKING:
    from dlmspec.spec.models import SlurmSpec, Spec


def effective_cross_entropy(setting: str, tensor_parallel: int, fsdp: str = "none") -> str:
    """``"fused_linear"`` or ``"megatron"``: what ``[kernels] cross_entropy = setting`` runs at
    TP = ``tensor_parallel`` with ``[parallel] fsdp``. ``"auto"`` fuses where the output layer is
    whole on the rank: TP = 1 and no Megatron-FSDP (which gathers the sharded output weight only
    inside the model's forward, while the fused loss uses it outside)."""
    if setting == "auto":
        return "fused_linear" if tensor_parallel == 1 and fsdp != "megatron" else "megatron"
    return setting


#: ``[parallel] cp_comm_type`` values the local layers implement: SDPA core attention all-gathers
#: keys and values over the context-parallel group (``dlmspec.backends.megatron.attention.CP_COMM_TYPES``,
#: megatron-core's spelling ``"all_gather"``); ``p2p``, ``a2a`` and ``a2a+p2p`` need Transformer
#: Engine's attention.
LOCAL_CP_COMM_TYPES = ("allgather",)


def sft_section(spec: Spec) -> Any:
    """``[stage.sft]`` with its defaults filled (``SFTSpec()`` where the spec has no such table)."""
    sft = spec.stage.sft
    return sft if sft is not None else section_defaults(spec, "SFTSpec")


def sft_pad_eos_tokens(spec: Spec) -> int | None:
    """The padding EOS an SFT sample supervises (``stage.sft.pad_eos_tokens``; ``None``: all).

    Unset: all for mdm (LLaDA, Nie et al. 2025, sec. 2.3: padding EOS are response tokens, so the
    model learns to fill its fixed generation length with EOS), 0 for ar (the conversation's own
    final EOD, supervised by its response mask, teaches an AR decoder to stop; EOS after EOS
    would only add easy tokens to the loss).
    """
    value = sft_section(spec).pad_eos_tokens
    if value is not None:
        return int(value)
    return None if spec.objective.kind == "mdm" else 0


def sft_attention_mask(spec: Spec) -> str | None:
    """Why an SFT stage's batches carry an attention mask (``"key = value"``), else ``None``: packed
    conversations (a document mask) or masked-diffusion padding only partly supervised (the rest
    hidden from the conversation), as ``backends/megatron/sft.py needs_attention_mask``."""
    if spec.stage.kind != "sft":
        return None
    sft = sft_section(spec)
    if sft.packed_sequence:
        return "stage.sft.packed_sequence = true"
    if spec.objective.kind == "mdm" and sft_pad_eos_tokens(spec) is not None:
        return f"stage.sft.pad_eos_tokens = {sft.pad_eos_tokens!r} with objective.kind = 'mdm'"
    return None


def default_loss_normalization(spec: Spec) -> str:
    """``train.loss_normalization`` when unset: ``"sequence"`` for an SFT stage of an mdm objective
    (LLaDA's SFT: each response's loss divided by its length, then the mean over responses, so a
    long answer does not outweigh a short one), else ``"global_token"``."""
    if spec.stage.kind == "sft" and spec.objective.kind == "mdm":
        return "sequence"
    return "global_token"


def layer_path_needs(spec: Spec, attention_mask: str, cp: int) -> tuple[list[str], list[str]]:
    """The spec's features that only one layer path runs, as ``"key = value"`` texts.

    Returns:
        ``(local_only, te_only)``. Local only (the Transformer Engine path refuses them): document
        masks, a per-query attention mask that the TE layers do not take
        (``dlmspec.backends.megatron.checks.check_masks_supported``), block-causal attention
        (``dlmspec.backends.megatron.layers.build_layer_spec``), and SFT batches with segment
        masks (:func:`sft_attention_mask`). Transformer Engine only: fp8
        (megatron-core runs fp8 in TE layers), grouped-GEMM experts (``build_layer_spec``) and
        context parallelism with a ``cp_comm_type`` outside :data:`LOCAL_CP_COMM_TYPES`
        (``dlmspec.backends.megatron.attention``). Variable-length sequences run on both paths
        (:func:`layer_path_prefers`).
    """
    data, par = spec.data, spec.parallel
    local = [text for text, on in (
        ("data.reset_attention_mask = true", data.reset_attention_mask),
        ("objective.attention_mask = 'block_causal'", attention_mask == "block_causal"),
        (sft_attention_mask(spec) or "", sft_attention_mask(spec) is not None),
    ) if on]
    te = [text for text, on in (
        (f"precision.fp8 = {spec.precision.fp8!r}", spec.precision.fp8 != "none"),
        ("model.moe_grouped_gemm = true", spec.model.moe_grouped_gemm),
        (f"parallel.cp_comm_type = {par.cp_comm_type!r} with context_parallel_size = {cp}",
         cp > 1 and par.cp_comm_type not in LOCAL_CP_COMM_TYPES),
    ) if on]
    return local, te


def layer_path_prefers(spec: Spec) -> list[str]:
    """The spec's features that ``auto`` runs on the local layers unless a Transformer Engine-only
    feature is there, as ``"key = value"`` texts: variable-length MDM sequences cut one by one
    (``objective.variable_length = "sequence"``; a ``"micro_batch"`` cut is a dense shorter
    micro-batch). Both paths run them (TE through its padding mask,
    ``dlmspec.backends.megatron.attention.with_key_padding``); the local one is where they were
    measured and planned, so ``auto`` keeps them there."""
    obj = spec.objective
    return [f"objective.variable_length_prob = {obj.variable_length_prob!r}"] if (
        obj.kind == "mdm" and obj.variable_length_prob > 0 and (obj.variable_length or "sequence") == "sequence"
    ) else []


def layer_path(spec: Spec, attention_mask: str, cp: int) -> tuple[str, str]:
    """``(transformer_impl, reason)``: the layer path train.py asks for.

    ``"local"`` or ``"transformer_engine"`` as ``model.transformer_impl`` says; for ``"auto"``
    the path the features need (:func:`layer_path_needs`): local when one needs it (then a
    Transformer Engine-only feature is reported by the validator against the local path), else
    Transformer Engine when one needs it, else local when one prefers it
    (:func:`layer_path_prefers`), else ``"auto"``: the runtime takes Transformer Engine where it
    imports on the GPU machine, else the local layers.
    """
    impl = spec.model.transformer_impl
    if impl != "auto":
        return impl, f"model.transformer_impl = {impl!r}"
    local, te = layer_path_needs(spec, attention_mask, cp)
    if local:
        return "local", (f"auto: {', '.join(local)} {'needs' if len(local) == 1 else 'need'} the local layers, "
                         "which the Transformer Engine path does not run")
    if te:
        return "transformer_engine", f"auto: {', '.join(te)} {'needs' if len(te) == 1 else 'need'} Transformer Engine"
    prefers = layer_path_prefers(spec)
    if prefers:
        return "local", (f"auto: {', '.join(prefers)} keeps the local layers, where it is measured; "
                         "model.transformer_impl = 'transformer_engine' runs it through TE's padding mask")
    return "auto", ("Transformer Engine where it imports on the GPU machine, else local; no feature of this "
                    "spec needs either")


#: The ``data.tokenizer`` keys each tokenizer type reads (Megatron-LM build_tokenizer, as
#: :func:`dlmspec.tokenizers.build_tokenizer` documents its arguments): its files, NullTokenizer's
#: and TikTokenizer's size, Hugging Face's optional vocab/merges overrides. ``eod_id`` is read by all.
TOKENIZER_READS: dict[str, tuple[str, ...]] = {
    "HuggingFaceTokenizer": ("model", "vocab_file", "merge_file"),
    "SentencePieceTokenizer": ("model",),
    "TikTokenizer": ("model", "vocab_size"),
    "GPT2BPETokenizer": ("vocab_file", "merge_file"),
    "NullTokenizer": ("vocab_size",),
    "BertWordPieceLowerCase": ("vocab_file",),
    "BertWordPieceCase": ("vocab_file",),
    "GPTSentencePieceTokenizer": ("model",),
    "Llama2Tokenizer": ("model",),
    "MultimodalTokenizer": ("model",),
    "NullMultimodalTokenizer": ("vocab_size",),
}

#: The ``data.tokenizer`` keys that name files or a size, in the order a spec lists them.
TOKENIZER_KEYS = ("model", "vocab_file", "merge_file", "vocab_size")

#: Ids of Megatron's GPT2BPETokenizer (GPT-2's byte-level BPE: 50,256 merges + <|endoftext|>).
GPT2_VOCAB_SIZE = 50257


def padded_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel: int) -> int:
    """Vocabulary padded to a multiple of ``divisible_by * tensor_parallel``, as Megatron-LM's
    ``_vocab_size_with_padding`` (megatron/training/tokenizer/tokenizer.py) does."""
    multiple = divisible_by * tensor_parallel
    return int(math.ceil(vocab_size / multiple) * multiple)


# --------------------------------------------------------------------------------------------
# Data blends: globs and manifests of shards (``data.train`` / ``data.valid``)

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
    from dlmspec.data.record import RecordError, read_record

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
                    "data-tokenizer-mixed", key, shard.entry, shard.prefix + ".dlmspec.json",
                    f"{shard.prefix!r} was written by {_describe_tokenizer(identity)}, {first[0]!r} by "
                    f"{_describe_tokenizer(first[1])}" + ("" if identity[:3] != first[1][:3] else
                                                          " (the same type with other files)") +
                    ": their ids mean other tokens", "prepare every dataset of the run with the spec's tokenizer "
                    "(`dlmspec data prepare` with the same tokenizer files), or remove the other ones"))
                break  # one per blend
    return out


@dataclass(frozen=True)
class Resolved:
    """A spec with every derived value.

    Attributes:
        spec: the validated spec.
        world_size: GPUs in the job (nodes * gpus_per_node).
        tp, pp, vpp, cp, ep, etp: parallel sizes (vpp is None without interleaving; etp
            defaults to tp).
        dp: data-parallel size, world / (tp * pp * cp) (megatron-core parallel_state).
        expert_dp: expert data-parallel size, world / (etp * ep * pp).
        num_microbatches: microbatches per step per DP rank, gbs / (mbs * dp).
        padded_vocab_size: vocab padded for TP (see :func:`padded_vocab_size`).
        num_query_groups, kv_channels, moe_ffn_hidden_size: model values with defaults filled.
        attention_mask: bidirectional, causal or block_causal.
        mask_token_id: [MASK] id for mdm (None for ar).
        train_iters: optimizer steps (from train_iters or train_tokens / tokens per step).
        tokens_per_step: global_batch_size * seq_length.
        params: counts with the tokenizer vocabulary (compare with published figures).
        params_padded: counts with the padded vocabulary (what is in memory).
        moe_layers: 1 per MoE layer, 0 per dense layer.
        gpu: the catalog entry of ``cluster.gpu`` (None if unknown; validate reports it).
        cross_entropy: ``"fused_linear"`` or ``"megatron"`` (``kernels.cross_entropy``;
            ``"auto"`` is fused_linear at TP = 1, where the output layer is not split).
        transformer_impl: the layer path train.py asks for, ``"transformer_engine"``,
            ``"local"`` or ``"auto"`` (the runtime decides), and transformer_impl_reason: why
            (:func:`layer_path`).
        train_blend, valid_blend: ``data.train`` / ``data.valid`` with globs and manifests
            expanded into shards weighted by tokens (:func:`resolve_blend`); empty with mock data.
    """

    spec: Spec
    world_size: int
    tp: int
    pp: int
    vpp: int | None
    cp: int
    ep: int
    etp: int
    dp: int
    expert_dp: int
    num_microbatches: int
    padded_vocab_size: int
    num_query_groups: int
    kv_channels: int
    moe_ffn_hidden_size: int | None
    attention_mask: str
    mask_token_id: int | None
    train_iters: int
    tokens_per_step: int
    params: ParamCounts
    params_padded: ParamCounts
    moe_layers: tuple[int, ...]
    gpu: GPU | None
    cross_entropy: str = "megatron"
    transformer_impl: str = "auto"
    transformer_impl_reason: str = ""
    train_blend: BlendResolution = BlendResolution()
    valid_blend: BlendResolution = BlendResolution()

    def tokenizer_size(self) -> int | None:
        """Ids the spec's tokenizer emits, when the spec says it (one more than its largest id):
        NullTokenizer's ``vocab_size + 1`` (its EOD is ``vocab_size``), GPT-2 BPE's 50257. None
        for a tokenizer whose files hold it (Hugging Face, SentencePiece, TikToken)."""
        tok = self.spec.data.tokenizer
        if tok.type == "NullTokenizer" and tok.vocab_size is not None:
            return tok.vocab_size + 1
        if tok.type == "GPT2BPETokenizer":
            return GPT2_VOCAB_SIZE
        if tok.type in FILE_FACT_TYPES:  # read from its files (dlmspec.tokenizers.tokenizer_facts)
            facts = spec_tokenizer_facts(self.spec)
            return facts.size if facts is not None else None
        return None

    def tokenizer_settings(self) -> list[tuple[str, Any]]:
        """``(key, value)`` of the ``data.tokenizer`` keys the tokenizer's type reads
        (:data:`TOKENIZER_READS`) and the spec sets, in :data:`TOKENIZER_KEYS` order; keys the type
        ignores are left out (the ``tokenizer-keys-ignored`` rule reports them)."""
        tok = self.spec.data.tokenizer
        reads = TOKENIZER_READS.get(tok.type, ())
        return [(k, getattr(tok, k)) for k in TOKENIZER_KEYS if k in reads and getattr(tok, k) is not None]

    def derived(self) -> dict[str, Any]:
        """The derived values as a JSON-ready dict (``dlmspec show``)."""
        return {
            "world_size": self.world_size,
            "data_parallel_size": self.dp,
            "expert_data_parallel_size": self.expert_dp,
            "num_microbatches": self.num_microbatches,
            "padded_vocab_size": self.padded_vocab_size,
            "num_query_groups": self.num_query_groups,
            "kv_channels": self.kv_channels,
            "expert_tensor_parallel_size": self.etp,
            "attention_mask": self.attention_mask,
            "mask_token_id": self.mask_token_id,
            "cross_entropy": self.cross_entropy,
            "transformer_impl": self.transformer_impl,
            "transformer_impl_reason": self.transformer_impl_reason,
            "train_iters": self.train_iters,
            "tokens_per_step": self.tokens_per_step,
            "parameters": {
                "total": self.params.total,
                "active": self.params.active,
                "embedding": self.params.embedding,
                "non_embedding": self.params.non_embedding,
                "total_padded_vocab": self.params_padded.total,
            },
        }


def resolve(spec: Spec) -> Resolved:
    """Derive every value of :class:`Resolved` from ``spec`` (no errors raised; see module doc)."""
    m, par, tr = spec.model, spec.parallel, spec.train
    world = spec.cluster.world_size
    tp, pp, cp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size, par.context_parallel_size
    ep = par.expert_model_parallel_size
    etp = par.expert_tensor_parallel_size or tp
    dp, expert_dp, num_microbatches = derive_layout(world, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp,
                                                    global_batch_size=tr.global_batch_size,
                                                    micro_batch_size=tr.micro_batch_size)
    padded = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp)
    attention = spec.objective.attention_mask or ("bidirectional" if spec.objective.kind == "mdm" else "causal")
    mask_id = None
    if spec.objective.kind == "mdm":
        mask_id = spec.objective.mask_token_id
        if mask_id is None:
            mask_id = MASK_TOKEN_IDS.get(m.preset or "", m.vocab_size)
    tokens_per_step = tr.global_batch_size * tr.seq_length
    impl, impl_reason = layer_path(spec, attention, cp)
    if tr.train_iters is not None:
        iters = tr.train_iters
    elif tr.train_tokens is not None:
        iters = max(1, math.ceil(tr.train_tokens / tokens_per_step))
    else:
        iters = 0
    return Resolved(
        spec=spec,
        world_size=world,
        tp=tp,
        pp=pp,
        vpp=par.virtual_pipeline_model_parallel_size,
        cp=cp,
        ep=ep,
        etp=etp,
        dp=dp,
        expert_dp=expert_dp,
        num_microbatches=num_microbatches,
        padded_vocab_size=padded,
        num_query_groups=m.num_query_groups or m.num_attention_heads,
        kv_channels=m.kv_channels or max(1, m.hidden_size // m.num_attention_heads),
        moe_ffn_hidden_size=(m.moe_ffn_hidden_size or m.ffn_hidden_size) if m.num_experts else None,
        attention_mask=attention,
        mask_token_id=mask_id,
        train_iters=iters,
        tokens_per_step=tokens_per_step,
        params=count_parameters(m),
        params_padded=count_parameters(m, padded),
        moe_layers=tuple(moe_layer_pattern(m)),
        gpu=GPUS.get(spec.cluster.gpu),
        cross_entropy=effective_cross_entropy(spec.kernels.cross_entropy, tp, spec.parallel.fsdp),
        transformer_impl=impl,
        transformer_impl_reason=impl_reason,
        train_blend=BlendResolution() if spec.data.mock else resolve_blend(spec.data.train, "data.train"),
        valid_blend=BlendResolution() if spec.data.mock else resolve_blend(spec.data.valid, "data.valid"),
    )


# --------------------------------------------------------------------------------------------
# Values of the runtime and the launch scripts


def run_dir(resolved: Resolved) -> str:
    """The runtime's ``LoggingConfig.run_dir`` (metrics.jsonl, exit_status.json, tensorboard/):
    ``logging.run_dir`` (``{name}`` already expanded, :mod:`dlmspec.spec.names`), default
    ``runs/<name>``."""
    return resolved.spec.logging.run_dir or f"runs/{resolved.spec.name}"


@dataclass(frozen=True)
class EodChoice:
    """The end-of-document id train.py passes to the runtime.

    Attributes:
        value: the id.
        source: where it comes from, for a comment in train.py.
        known: False when the id could not be told and ``value`` only fills the place.
    """

    value: int
    source: str
    known: bool = True


#: GPT-2's end-of-document token and its id in the GPT-2 BPE vocabulary (Radford et al. 2019,
#: encoder.json; ``dlmspec.tokenizers.GPT2_EOD_TOKEN``).
GPT2_EOD = ("<|endoftext|>", 50256)


def _hf_eos_id(folder: str) -> tuple[str, int] | None:
    """``(token, id)`` of the EOS token of a local Hugging Face tokenizer folder, read from its
    ``tokenizer_config.json`` (``eos_token``) and ``tokenizer.json`` (``added_tokens``, then
    ``model.vocab``); None when either file is missing or has no such entry."""
    config = read_json(os.path.join(folder, "tokenizer_config.json"))
    data = read_json(os.path.join(folder, "tokenizer.json"))
    if not isinstance(config, dict) or not isinstance(data, dict):
        return None
    eos = config.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if not isinstance(eos, str):
        return None
    for entry in data.get("added_tokens") or []:
        if isinstance(entry, dict) and entry.get("content") == eos and isinstance(entry.get("id"), int):
            return eos, entry["id"]
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and isinstance(vocab.get(eos), int):
        return eos, vocab[eos]
    return None


def gpt2_eod_id(vocab_file: str | None) -> int:
    """GPT-2 BPE's ``<|endoftext|>`` id: from ``vocab_file`` when it is readable JSON, else 50256."""
    vocab = read_json(vocab_file) if vocab_file else None
    value = vocab.get(GPT2_EOD[0]) if isinstance(vocab, dict) else None
    return value if isinstance(value, int) else GPT2_EOD[1]


#: Tokenizer types whose size and EOD :func:`spec_tokenizer_facts` reads (the older types keep
#: their own branches above).
FILE_FACT_TYPES = ("BertWordPieceLowerCase", "BertWordPieceCase", "SentencePieceTokenizer",
                   "GPTSentencePieceTokenizer", "Llama2Tokenizer", "TikTokenizer", "NullMultimodalTokenizer")


def spec_tokenizer_facts(spec: Spec) -> TokenizerFacts | None:
    """:func:`dlmspec.tokenizers.tokenizer_facts` of the spec's ``[data.tokenizer]``."""
    tok = spec.data.tokenizer
    return tokenizer_facts(tok.type, tokenizer_model=tok.model, vocab_file=tok.vocab_file,
                           vocab_size=tok.vocab_size)


def eod_choice(spec: Spec) -> EodChoice:
    """The end-of-document id of the spec's tokenizer: ``data.tokenizer.eod_id`` when set;
    else GPT2BPETokenizer's ``<|endoftext|>`` (from ``vocab_file`` when readable, else 50256);
    NullTokenizer's ``vocab_size`` (megatron-core ``NullTokenizer``: EOD = vocab_size); a local
    Hugging Face folder's EOS token (:func:`_hf_eos_id`). Otherwise (a hub name, SentencePiece,
    TikToken) it is unknown: ``model.vocab_size - 1`` fills the place, ``known`` is False, and
    the ``eod-id-unknown`` rule (:mod:`dlmspec.check.runtime`) reports it."""
    tok = spec.data.tokenizer
    if tok.eod_id is not None:
        return EodChoice(tok.eod_id, "data.tokenizer.eod_id")
    if tok.type == "GPT2BPETokenizer":
        return EodChoice(gpt2_eod_id(tok.vocab_file), f"{GPT2_EOD[0]} of the GPT-2 BPE vocabulary")
    if tok.type == "NullTokenizer":
        value = tok.vocab_size if tok.vocab_size is not None else spec.model.vocab_size - 1
        return EodChoice(value, "NullTokenizer: EOD = its vocab_size (megatron-core NullTokenizer)")
    if tok.type in ("HuggingFaceTokenizer", "MultimodalTokenizer") and tok.model and os.path.isdir(tok.model):
        found = _hf_eos_id(tok.model)
        if found is not None:
            return EodChoice(found[1], f"eos token {found[0]!r} of {tok.model}")
    facts = spec_tokenizer_facts(spec)
    if facts is not None and facts.eod is not None:
        return EodChoice(facts.eod, f"{tok.type}'s EOD, from {facts.source}")
    return EodChoice(spec.model.vocab_size - 1, "unknown at compile time; nothing in this run reads it", known=False)


def eod_used_by(spec: Spec) -> list[str]:
    """The spec keys that make the runtime read the end-of-document id (sorted)."""
    d = spec.data
    flags = {"data.mock": d.mock, "data.reset_attention_mask": d.reset_attention_mask,
             "data.reset_position_ids": d.reset_position_ids, "data.eod_mask_loss": d.eod_mask_loss}
    return sorted(k for k, on in flags.items() if on)


def slurm_settings(resolved: Resolved) -> SlurmSpec:
    """``[cluster.slurm]`` of the spec, or its defaults when the table is absent (a
    :class:`~dlmspec.spec.fast.SpecTable` for a spec loaded with ``fast=True``: no pydantic)."""
    slurm = resolved.spec.cluster.slurm
    if slurm:
        return slurm
    return section_defaults(resolved.spec, "SlurmSpec")


def job_name(resolved: Resolved) -> str:
    """``cluster.slurm.job_name`` when written in the spec, else the spec's ``name``."""
    slurm = resolved.spec.cluster.slurm
    if slurm is not None and "job_name" in slurm.model_fields_set:
        return slurm.job_name
    return resolved.spec.name

# --------------------------------------------------------------------------------------------
# What train.py passes to megatron-core and the runtime beyond the spec's own values: decided
# here, once, so the templates only print them.


def schedule(resolved: Resolved) -> dict[str, Any]:
    """Learning-rate schedule lengths in optimizer steps, as Megatron-LM derives them
    (megatron/training/training.py ``get_optimizer_param_scheduler``): decay over
    ``lr_decay_iters`` (default ``train_iters``); warmup ``lr_warmup_fraction * lr_decay_iters``
    when the fraction is set, else ``lr_warmup_iters``; WSD's decay phase ``lr_wsd_decay_iters``
    (default: the whole decay, i.e. ``lr_decay_iters``)."""
    tr = resolved.spec.train
    decay = tr.lr_decay_iters or resolved.train_iters
    warmup = int(tr.lr_warmup_fraction * decay) if tr.lr_warmup_fraction is not None else tr.lr_warmup_iters
    wsd = tr.lr_wsd_decay_iters or decay
    return {"lr_decay_iters": decay, "lr_warmup_iters": warmup, "lr_wsd_decay_iters": wsd}


#: Keys ``spec.lock.toml`` writes in from resolved values (:func:`lock_filled`): what
#: :func:`locked_spec` may change, and what the loader may unset again in a lock it reads
#: (:func:`dlmspec.spec.load.load`'s round trip), so that both use one list.
LOCK_FILLED_KEYS: tuple[str, ...] = (
    "model.num_query_groups",
    "model.kv_channels",
    "model.moe_ffn_hidden_size",
    "parallel.expert_tensor_parallel_size",
    "objective.attention_mask",
    "objective.mask_token_id",
    "train.train_iters",
    "train.lr_decay_iters",
    "checkpoint.load",
    "logging.run_dir",
    "data.train",
    "data.valid",
)


def lock_filled(resolved: Resolved) -> dict[str, Any]:
    """Dotted key (of :data:`LOCK_FILLED_KEYS`) -> the value ``spec.lock.toml`` writes for it:
    the defaults :func:`resolve` fills (query groups, head dimension, expert TP, MoE FFN size,
    attention mask, mask token, train_iters) and the runtime's (lr_decay_iters from
    :func:`schedule`, ``checkpoint.load`` following ``checkpoint.save``, :func:`run_dir`).
    ``data.train`` / ``data.valid`` are written as their resolved shards (:func:`resolve_blend`)
    when they name a glob or a manifest, so the lock compiles to the same blend when the files
    have changed since. Keys whose value is unknown (no MoE FFN, no mask token, no steps,
    nothing saved) are left out."""
    filled: dict[str, Any] = {
        "model.num_query_groups": resolved.num_query_groups,
        "model.kv_channels": resolved.kv_channels,
        "parallel.expert_tensor_parallel_size": resolved.etp,
        "objective.attention_mask": resolved.attention_mask,
    }
    if resolved.moe_ffn_hidden_size is not None:
        filled["model.moe_ffn_hidden_size"] = resolved.moe_ffn_hidden_size
    if resolved.mask_token_id is not None:
        filled["objective.mask_token_id"] = resolved.mask_token_id
    if resolved.train_iters > 0:
        filled["train.train_iters"] = resolved.train_iters
        filled["train.lr_decay_iters"] = schedule(resolved)["lr_decay_iters"]
    if resolved.spec.checkpoint.load is None and resolved.spec.checkpoint.save is not None:
        filled["checkpoint.load"] = resolved.spec.checkpoint.save
    filled["logging.run_dir"] = run_dir(resolved)
    for key, blend in (("data.train", resolved.train_blend), ("data.valid", resolved.valid_blend)):
        if blend.expanded and blend.shards and not blend.problems:
            filled[key] = [{"prefix": prefix, "weight": weight} for prefix, weight in blend.pairs()]
    return filled


def locked_spec(resolved: Resolved) -> Spec:
    """The spec with every value of :func:`lock_filled` written in, without any ``[lock]``
    table. The end-of-document id is not filled in (it may be read from tokenizer files,
    :func:`eod_choice`); ``[lock.derived]`` records it. Loading its TOML gives back the same
    :class:`Resolved`. :func:`dlmspec.render.compile.content_hash` hashes it."""
    return resolved.spec.replace(lock=None, **lock_filled(resolved))


def init_cache_dir(resolved: Resolved) -> str | None:
    """Where the runtime converts ``checkpoint.init_from = "hf:PATH"`` weights once
    (``CheckpointConfig.init_cache_dir``): ``<checkpoint.save>/init_from_hf``, or
    ``<run_dir>/init_from_hf`` for a run that saves nothing
    (``dlmspec.backends.megatron.init_from.default_cache_dir``); None unless ``init_from`` is ``hf:``."""
    init = resolved.spec.checkpoint.init_from
    if init is None or not init.startswith("hf:"):
        return None
    return posixpath.join(resolved.spec.checkpoint.save or run_dir(resolved), "init_from_hf")


@dataclass(frozen=True)
class RuntimeValues:
    """The values train.py passes to megatron-core and the runtime that the spec does not state
    one to one: the templates print these and decide nothing.

    Attributes:
        lr_warmup_iters, lr_decay_iters: :func:`schedule`'s lengths in optimizer steps.
        lr_wsd_decay_iters: WSD's decay phase; None unless ``lr_decay_style = "WSD"``.
        lr_points: ``train.lr_points`` as ``[[step, lr], ...]`` lists for ``lr_decay_style =
            "piecewise"`` (``ScheduleConfig.lr_points``), else None.
        recompute_granularity, recompute_method, recompute_num_layers: ``TransformerConfig``'s
            (None where ``[recompute]`` leaves them unused).
        cp_comm_type: megatron-core's spelling (``"all_gather"`` for the spec's ``"allgather"``).
        block_size: the objective's block size under block-causal attention, else None.
        fsdp: Megatron-FSDP (``parallel.fsdp = "megatron"``); fsdp_reduce_scatter /
            fsdp_all_gather: its strategy shards gradients / parameters.
        grad_reduce_group: GPUs a gradient is reduced over, data x context parallel =
            world / (TP x PP) (megatron-core's DDP reduces over the data-parallel group with CP).
        overlap_grad_reduce, overlap_param_gather: ``DistributedDataParallelConfig``'s: the
            spec's switch where gradients cross GPUs (False when ``grad_reduce_group`` is 1:
            nothing to overlap), always on where Megatron-FSDP shards them.
        cuda_device_max_connections_1: ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (TP > 1 or sequence
            parallel, so TP communication is issued in order with compute; never with
            Megatron-FSDP, which Megatron-LM refuses to run with it).
        use_transformer_engine: None / True / False for the resolved ``transformer_impl``
            auto / transformer_engine / local (:func:`layer_path`).
        bias_activation_fusion: megatron-core fuses bias + activation for SwiGLU, GeGLU and gelu
            with a bias only (``MLP.forward``).
        peak_tflops, peak_source: the dense bf16 peak of ``cluster.gpu`` in TFLOP/s (fp32 for
            fp32 runs) for the runtime's MFU, and where it comes from; None outside the catalog.
        init_cache_dir: :func:`init_cache_dir`.
        resume_from_run: ``checkpoint.resume_from_run`` when a resume can happen
            (``checkpoint.resume``), else None: the other spec name whose checkpoints the runtime
            may resume (``CheckpointConfig.resume_from_run``).
        min_masked_tokens, variable_length, loss_normalization: ``objective.min_masked_tokens``
            (unset: 0), ``objective.variable_length`` (unset: ``"sequence"``) and
            ``train.loss_normalization`` (unset: :func:`default_loss_normalization`) with their defaults filled.
        calculate_per_token_loss: megatron-core's ``TransformerConfig.calculate_per_token_loss``:
            True exactly for ``"global_token"`` (docs/recipes.md, "Loss normalisation").
        shift, cart_p: ``objective.shift`` (unset: False) and, with ``loss_weighting = "cart"`` only,
            ``objective.cart_p`` (unset: :data:`CART_P_DEFAULT`, Dream's trainers' 0.1); None otherwise.
        unshift: ``objective.unshift`` of an mdm pre-training stage (an SFT stage never unshifts).
        variable_length_multiple: what a micro-batch cut's length is a multiple of: 2 x CP
            (megatron-core's load-balanced CP split, ``get_batch_on_this_cp_rank``) and TP under
            sequence parallelism (the sequence is split over TP ranks), their least common
            multiple; 1 without either.
    """

    lr_warmup_iters: int
    lr_decay_iters: int
    lr_wsd_decay_iters: int | None
    recompute_granularity: str | None
    recompute_method: str | None
    recompute_num_layers: int | None
    cp_comm_type: str
    block_size: int | None
    fsdp: bool
    fsdp_reduce_scatter: bool
    fsdp_all_gather: bool
    grad_reduce_group: int
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    cuda_device_max_connections_1: bool
    use_transformer_engine: bool | None
    bias_activation_fusion: bool
    peak_tflops: float | None
    peak_source: str
    init_cache_dir: str | None
    resume_from_run: str | None = None
    min_masked_tokens: int = 0
    variable_length: str = "sequence"
    loss_normalization: str = "global_token"
    calculate_per_token_loss: bool = True
    variable_length_multiple: int = 1
    lr_points: list[list[int | float]] | None = None
    shift: bool = False
    cart_p: float | None = None
    unshift: bool = False


#: ``objective.cart_p`` unset: DreamLM's trainers' config default (DreamLM/Dream-Coder@87409da
#: ``instruct/src/trainer/config/sft_trainer.yaml:57``; the runtime's ``objective.CART_P_DEFAULT``).
CART_P_DEFAULT = 0.1


def runtime_values(resolved: Resolved) -> RuntimeValues:
    """The :class:`RuntimeValues` of ``resolved`` (pure: same spec, same values)."""
    spec = resolved.spec
    m, par, rc, tr = spec.model, spec.parallel, spec.recompute, spec.train
    lengths = schedule(resolved)
    fsdp = par.fsdp == "megatron"
    reduce_scatter = fsdp and par.data_parallel_sharding_strategy in ("optim_grads", "optim_grads_params")
    all_gather = fsdp and par.data_parallel_sharding_strategy == "optim_grads_params"
    group = data_parallel_size(resolved.world_size, resolved.tp, resolved.pp, 1)  # DP x CP
    gpu = resolved.gpu
    if gpu is None:
        peak, peak_source = None, f"GPU {spec.cluster.gpu!r} is not in the catalog: no MFU"
    elif spec.precision.dtype == "fp32":
        peak, peak_source = float(gpu.fp32_tflops), f"{gpu.name}, dense fp32 peak"
    else:
        peak, peak_source = float(gpu.bf16_tflops), f"{gpu.name}, dense bf16 peak"
    full = rc.granularity == "full"
    normalization = tr.loss_normalization or default_loss_normalization(spec)
    return RuntimeValues(
        lr_warmup_iters=lengths["lr_warmup_iters"],
        lr_decay_iters=lengths["lr_decay_iters"],
        lr_wsd_decay_iters=lengths["lr_wsd_decay_iters"] if tr.lr_decay_style == "WSD" else None,
        lr_points=([[int(step), float(lr)] for step, lr in tr.lr_points]
                   if tr.lr_decay_style == "piecewise" and tr.lr_points else None),
        recompute_granularity=None if rc.granularity == "none" else rc.granularity,
        recompute_method=rc.method if full else None,
        recompute_num_layers=rc.num_layers if full else None,
        cp_comm_type="all_gather" if par.cp_comm_type == "allgather" else par.cp_comm_type,
        block_size=spec.objective.block_size if resolved.attention_mask == "block_causal" else None,
        fsdp=fsdp,
        fsdp_reduce_scatter=reduce_scatter,
        fsdp_all_gather=all_gather,
        grad_reduce_group=group,
        overlap_grad_reduce=reduce_scatter or (par.overlap_grad_reduce and group > 1),
        overlap_param_gather=all_gather or (par.overlap_param_gather and group > 1),
        cuda_device_max_connections_1=(resolved.tp > 1 or par.sequence_parallel) and not fsdp,
        use_transformer_engine={"auto": None, "transformer_engine": True, "local": False}[resolved.transformer_impl],
        bias_activation_fusion=m.activation in ("swiglu", "geglu") or (m.activation == "gelu" and m.add_bias_linear),
        peak_tflops=peak,
        peak_source=peak_source,
        init_cache_dir=init_cache_dir(resolved),
        resume_from_run=spec.checkpoint.resume_from_run if spec.checkpoint.resume else None,
        min_masked_tokens=spec.objective.min_masked_tokens or 0,
        variable_length=spec.objective.variable_length or "sequence",
        loss_normalization=normalization,
        calculate_per_token_loss=normalization == "global_token",
        variable_length_multiple=math.lcm(2 * resolved.cp if resolved.cp > 1 else 1,
                                          resolved.tp if par.sequence_parallel and resolved.tp > 1 else 1),
        shift=bool(spec.objective.shift),
        unshift=bool(spec.objective.unshift) and spec.objective.kind == "mdm" and spec.stage.kind != "sft",
        cart_p=((CART_P_DEFAULT if spec.objective.cart_p is None else spec.objective.cart_p)
                if spec.objective.loss_weighting == "cart" else None),
    )
