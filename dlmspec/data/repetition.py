"""Epochs and repetition of a run's training data: the one place for their arithmetic.

What ``plan``, ``show`` and ``validate`` say about a run's data, and what the runtime selects for
``data.train[].max_unique_tokens``, all come from here:

* **Documents.** megatron-core's GPT datasets split and sample an indexed dataset by its
  *sequences* (``GPTDataset.numel_low_level_dataset`` is ``len(sequence_lengths)``); with
  ``dlmspec data prepare`` (and Megatron-LM's ``preprocess_data.py`` without sentence
  splitting) each document is one sequence. "Document" below means such a sequence.
* **Training split** (:func:`train_split_bounds`). Without ``data.valid`` the builder carves
  ``data.split`` out of each dataset: documents ``[round(a * S), round(b * S))`` of its ``S``
  documents, where ``(a, b)`` is the training row of the split matrix
  (megatron.core.datasets.blended_megatron_dataset_config.parse_and_normalize_split and
  convert_split_vector_to_split_matrix, blended_megatron_dataset_builder
  ``_build_megatron_dataset_splits``). With ``data.valid`` every document trains.
* **Cap** (:func:`capped_documents`). ``max_unique_tokens = U`` keeps the longest prefix of the
  training split's documents, in file order, whose tokens do not exceed ``U``:
  ``k = max{k : sum(len[0..k)) <= U}``. File order is the same for every seed and rank count
  (megatron-core shuffles documents *after* this selection, from the seed), so a capped run
  repeats the same documents every time; the validation documents are those of the uncapped
  split.
* **Draws** (:func:`repetition`). A run draws ``T = train_iters x global_batch_size x
  seq_length`` tokens (each sample advances ``seq_length`` tokens through the document index;
  AR's extra label token overlaps the next sample: megatron-core ``GPTDataset`` sample index).
  ``train_iters`` is ``ceil(train_tokens / (global_batch_size x seq_length))`` when the spec
  gives ``train.train_tokens`` (:func:`dlmspec.resolve.resolve`). megatron-core's
  ``BlendedDataset`` draws dataset ``i`` in proportion to its normalised weight:
  ``T_i = w_i / sum(w) x T``.
* **Epochs** ``E_i = T_i / U_i`` where ``U_i`` is dataset ``i``'s unique training tokens (after
  the split and the cap); **unique tokens seen** ``min(T_i, U_i)`` (a draw of less than an epoch
  reads each token of the shuffled documents at most once). The run's totals:
  ``T = sum(T_i)``, ``U = sum(U_i)``, seen ``= sum(min(T_i, U_i))``, epochs ``T / U``.

Counts come from each dataset's ``.idx`` (:func:`dlmspec.data.index.check_index`: exact per
document; the ``.bin`` is checked when present, but the counts need only the index); without a readable index, from its record (``PREFIX.dlmspec.json``,
:mod:`dlmspec.data.record`: ``tokens``) only where neither a split nor a cap needs the
per-document lengths. Otherwise the counts are *unknown* and :attr:`DatasetTokens.why` says why;
nothing is estimated.

The literature thresholds for a note (:data:`AR_EPOCHS`, :data:`DIFFUSION_EPOCHS`) live here too,
with their sources.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

#: AR: epochs past which repeated data is worth markedly less than new data. Muennighoff et al.
#: 2023, "Scaling Data-Constrained Language Models" (NeurIPS 2023, arXiv:2305.16264): up to ~4
#: epochs repeated tokens are about as good as unique ones; the returns then diminish (their fitted
#: decay constant R*_D ~ 15.4 repetitions) and vanish around 16 epochs and beyond.
AR_EPOCHS = 4.0
AR_SOURCE = ("Muennighoff et al. 2023, 'Scaling Data-Constrained Language Models' (arXiv:2305.16264): for AR "
             "models repeated data is about as useful as new data up to ~4 epochs, then returns diminish "
             "(fitted R*_D ~ 15.4)")
#: Masked diffusion LMs: epochs past which the studies report no measurements of continued gains.
#: Prabhudesai et al. 2025, "Diffusion Beats Autoregressive in Data-Constrained Settings"
#: (arXiv:2507.15857): masked diffusion models use repeated data up to ~100 epochs about as well as
#: new data (AR: ~4). Ni et al. 2025, "Diffusion Language Models are Super Data Learners"
#: (arXiv:2511.03276): DLMs keep gaining with more epochs where AR saturates (a 1.7B DLM trained on
#: ~1.5T tokens of compute over 10B unique tokens, ~150 epochs, overtakes a matched AR coder);
#: validation cross-entropy may rise while downstream scores still improve. dlmspec notes past
#: 100 epochs: beyond the regime both report as well-behaved.
DIFFUSION_EPOCHS = 100.0
DIFFUSION_SOURCE = ("Prabhudesai et al. 2025, 'Diffusion Beats Autoregressive in Data-Constrained Settings' "
                    "(arXiv:2507.15857): masked diffusion LMs use repeated data up to ~100 epochs about as well as "
                    "new data; Ni et al. 2025, 'Diffusion Language Models are Super Data Learners' "
                    "(arXiv:2511.03276): DLMs keep gaining over ~150 epochs where AR saturates, though validation "
                    "loss may rise")


def epoch_threshold(diffusion: bool) -> tuple[float, str]:
    """``(epochs, source)`` past which repetition exceeds what the literature reports as
    well-behaved: :data:`DIFFUSION_EPOCHS` for a diffusion objective (mdm, block diffusion),
    :data:`AR_EPOCHS` for AR."""
    return (DIFFUSION_EPOCHS, DIFFUSION_SOURCE) if diffusion else (AR_EPOCHS, AR_SOURCE)


def split_vector(split: str) -> list[float]:
    """``data.split`` as megatron-core's normalised ``[train, valid, test]`` weights
    (``parse_and_normalize_split``: the numbers in the string, padded with zeros to three,
    divided by their sum).

    Raises:
        ValueError: not up to three non-negative numbers with a positive sum.
    """
    parts = [float(x) for x in re.findall(r"[.0-9]+", split)]
    parts += [0.0] * (3 - len(parts))
    if len(parts) != 3 or any(p < 0 for p in parts) or sum(parts) <= 0:
        raise ValueError(f"data.split {split!r} is not up to three non-negative weights with a positive sum")
    total = parts[0] + parts[1] + parts[2]
    return [p / total for p in parts]


def train_split_bounds(sequences: int, split: str | None) -> tuple[int, int]:
    """``(begin, end)``: the documents ``[begin, end)`` of a dataset of ``sequences`` documents
    that megatron-core trains on. ``split`` None (``data.valid`` given: the builder's
    ``blend_per_split``) trains on all of them; else the training row ``(0, f)`` of the split
    matrix, ``f`` the normalised train weight, as ``(round(0 * S), round(f * S))``
    (blended_megatron_dataset_builder ``_build_megatron_dataset_splits``: ``int(round(x *
    float(num_elements)))``)."""
    if split is None:
        return 0, sequences
    share = split_vector(split)[0]
    return int(round(0.0 * float(sequences))), int(round(share * float(sequences)))


def capped_documents(lengths: Any, cap: int) -> int:
    """How many leading documents of ``lengths`` (tokens per document, in file order: a sequence
    or a 1-D integer array) a cap of ``cap`` tokens keeps: the largest ``k`` with
    ``sum(lengths[:k]) <= cap`` (0 when the first document alone is longer).

    Raises:
        ValueError: ``cap`` is not positive.
    """
    import numpy as np

    if cap <= 0:
        raise ValueError(f"max_unique_tokens must be > 0, got {cap}")
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    return int(np.searchsorted(ends, cap, side="right"))


#: Document lengths read at a time from an index (memory stays flat on a large one).
CHUNK = 1 << 22


def _split_counts(lengths: Any, begin: int, end: int, cap: int | None) -> tuple[int, int, int]:
    """``(split tokens, kept documents, unique tokens)`` of documents ``[begin, end)`` of
    ``lengths`` (a 1-D integer array, e.g. the memory-mapped ``sequence_lengths``) under ``cap``
    (None: every document kept), in pieces of :data:`CHUNK`: the same answer as
    :func:`capped_documents` over the whole split."""
    import numpy as np

    split_tokens = 0
    kept, unique, full = end - begin, None, cap is None
    for start in range(begin, end, CHUNK):
        part = np.asarray(lengths[start:min(end, start + CHUNK)], dtype=np.int64)
        if not full and unique is None:
            room = cap - split_tokens  # tokens the cap leaves for this piece
            fits = capped_documents(part, room) if room > 0 else 0
            if fits < len(part):
                kept = start - begin + fits
                unique = split_tokens + int(part[:fits].sum())
        split_tokens += int(part.sum())
    if unique is None:
        unique = split_tokens
    return split_tokens, kept, unique


@dataclass(frozen=True)
class DatasetTokens:
    """The unique training tokens of one dataset of ``data.train``.

    Attributes:
        prefix: The dataset (``PREFIX.bin`` / ``PREFIX.idx``).
        entry: The ``data.train`` entry it came from, as written.
        cap: Its ``max_unique_tokens`` (None: uncapped).
        tokens: Tokens of the whole dataset (None: unknown).
        documents: Documents of the whole dataset (None: unknown).
        split_tokens: Tokens of its training split, before the cap (None: unknown).
        unique_tokens: Tokens training reads: the split after the cap (None: unknown).
        kept_documents: Documents training reads (None: unknown).
        first_document: Tokens of the training split's first document (None: unknown or empty).
        source: ``"index"`` (``PREFIX.idx``) or ``"record"`` (``PREFIX.dlmspec.json``); None when unknown.
        why: Why the counts are unknown (None when known).
    """

    prefix: str
    entry: str
    cap: int | None = None
    tokens: int | None = None
    documents: int | None = None
    split_tokens: int | None = None
    unique_tokens: int | None = None
    kept_documents: int | None = None
    first_document: int | None = None
    source: str | None = None
    why: str | None = None


def dataset_tokens(prefix: str, *, split: str | None, cap: int | None = None,
                   entry: str | None = None) -> DatasetTokens:
    """The unique training tokens of dataset ``prefix`` (see the module docstring). Cached by the
    ``.idx``'s, ``.bin``'s and the record's size and modification time (a sweep's members share
    their data; a rewritten file is read again). The index is read in pieces of
    :data:`CHUNK` documents, so memory stays flat on an index of millions of documents.

    Args:
        prefix: The dataset path without ``.bin`` / ``.idx``.
        split: ``data.split`` when the builder carves the validation data out of ``data.train``
            (no ``data.valid``), else None.
        cap: ``max_unique_tokens``, or None.
        entry: The ``data.train`` entry as written (default: ``prefix``).

    Returns:
        A :class:`DatasetTokens`; never raises on unreadable files (``why`` says what).
    """
    import dataclasses
    import os

    from dlmspec.data.record import record_path

    entry = prefix if entry is None else entry
    marks = []
    for path in (prefix + ".idx", prefix + ".bin", record_path(prefix)):
        try:
            st = os.stat(path)
            marks.append((st.st_size, st.st_mtime_ns, st.st_ino))
        except (OSError, ValueError):
            marks.append(None)
    found = _dataset_tokens_cached(prefix, split, cap, tuple(marks))
    return found if found.entry == entry else dataclasses.replace(found, entry=entry)


@functools.lru_cache(maxsize=1024)
def _dataset_tokens_cached(prefix: str, split: str | None, cap: int | None, marks: tuple) -> DatasetTokens:
    del marks  # the cache key: the files' sizes and modification times
    from dlmspec.data.index import check_index
    from dlmspec.data.record import RecordError, read_record, record_path
    from dlmspec.files import FileRefused

    entry = prefix
    try:
        facts = check_index(prefix, bin_optional=True)  # the counts need the document lengths, not the tokens
    except FileRefused as exc:
        reason = f"{exc.path}: {exc.why}"
    except (OSError, ValueError) as exc:
        reason = f"{prefix}.idx: cannot be read ({exc})"
    else:
        begin, end = train_split_bounds(facts.sequences, split)
        split_tokens, kept, unique = _split_counts(facts.sequence_lengths, begin, end, cap)
        first = int(facts.sequence_lengths[begin]) if end > begin else None
        return DatasetTokens(prefix, entry, cap, facts.tokens, facts.sequences, split_tokens, unique, kept, first,
                             "index")
    try:
        record = read_record(prefix)
    except (RecordError, OSError) as exc:
        return DatasetTokens(prefix, entry, cap, why=f"{reason}; its record cannot be read ({exc})")
    tokens = record.get("tokens") if isinstance(record, dict) else None
    documents = record.get("documents") if isinstance(record, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        where = f"no record ({record_path(prefix)})" if record is None else "its record gives no token count"
        return DatasetTokens(prefix, entry, cap, why=f"{reason}; {where}")
    documents = documents if isinstance(documents, int) and not isinstance(documents, bool) else None
    whole = split is None or split_vector(split)[0] == 1.0
    if cap is None and whole:
        return DatasetTokens(prefix, entry, cap, tokens, documents, tokens, tokens, documents, source="record")
    needs = "the cap" if cap is not None else f"data.split {split!r}"
    return DatasetTokens(prefix, entry, cap, tokens, documents, source="record",
                         why=f"{reason}; its record gives {tokens:,} tokens in all, but {needs} needs each "
                         "document's length (the .idx)")


@dataclass(frozen=True)
class DatasetRepetition:
    """One dataset's share of a run: :class:`DatasetTokens` and what the run draws from it.

    Attributes:
        data: Its unique tokens.
        weight: Its normalised blend weight ``w_i / sum(w)``.
        drawn_tokens: ``T_i = weight x T``: the tokens the run draws from it.
        epochs: ``T_i / U_i`` (None when ``U_i`` is unknown or 0).
        seen_tokens: ``min(T_i, U_i)`` (None when unknown).
    """

    data: DatasetTokens
    weight: float
    drawn_tokens: float
    epochs: float | None
    seen_tokens: float | None


@dataclass(frozen=True)
class Repetition:
    """The epochs and unique tokens of a run's training data (:func:`repetition`).

    Attributes:
        datasets: One :class:`DatasetRepetition` per dataset of the resolved ``data.train``.
        drawn_tokens: ``T = train_iters x global_batch_size x seq_length``.
        unique_tokens: ``sum(U_i)`` (None when any is unknown).
        seen_tokens: ``sum(min(T_i, U_i))`` (None when any is unknown).
        epochs: ``T / sum(U_i)`` (None when unknown).
        threshold, source: The epochs past which :attr:`over` names a dataset, and its source
            (:func:`epoch_threshold`).
        diffusion: Whether the objective is a diffusion one (which threshold applies).
    """

    datasets: tuple[DatasetRepetition, ...]
    drawn_tokens: int
    unique_tokens: int | None
    seen_tokens: float | None
    epochs: float | None
    threshold: float
    source: str
    diffusion: bool
    unknown: tuple[str, ...] = field(default_factory=tuple)

    @property
    def over(self) -> tuple[DatasetRepetition, ...]:
        """The datasets repeated for more than :attr:`threshold` epochs."""
        return tuple(d for d in self.datasets if d.epochs is not None and d.epochs > self.threshold)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``plan --json`` ``result.data``)."""
        return {
            "drawn_tokens": self.drawn_tokens, "unique_tokens": self.unique_tokens,
            "seen_tokens": None if self.seen_tokens is None else int(round(self.seen_tokens)),
            "epochs": self.epochs, "epoch_threshold": self.threshold, "threshold_source": self.source,
            "datasets": [{
                "prefix": d.data.prefix, "entry": d.data.entry, "weight": d.weight, "max_unique_tokens": d.data.cap,
                "tokens": d.data.tokens, "documents": d.data.documents, "split_tokens": d.data.split_tokens,
                "unique_tokens": d.data.unique_tokens, "kept_documents": d.data.kept_documents,
                "drawn_tokens": int(round(d.drawn_tokens)), "epochs": d.epochs,
                "seen_tokens": None if d.seen_tokens is None else int(round(d.seen_tokens)),
                "source": d.data.source, "unknown": d.data.why,
            } for d in self.datasets],
        }


def repeat(datasets: Sequence[tuple[DatasetTokens, float]], drawn_tokens: int, *, diffusion: bool) -> Repetition:
    """The arithmetic of the module docstring over ``[(dataset, weight), ...]`` (weights as
    written: normalised here) for a run drawing ``drawn_tokens`` tokens.

    Raises:
        ValueError: no dataset, or a weight that is not positive.
    """
    if not datasets:
        raise ValueError("no training datasets")
    if any(w <= 0 for _, w in datasets):
        raise ValueError("blend weights must be > 0")
    total_weight = math.fsum(w for _, w in datasets)
    rows = []
    for data, weight in datasets:
        share = weight / total_weight
        drawn = share * drawn_tokens
        unique = data.unique_tokens
        epochs = drawn / unique if unique else None
        seen = min(drawn, unique) if unique is not None else None
        rows.append(DatasetRepetition(data, share, drawn, epochs, seen))
    uniques = [r.data.unique_tokens for r in rows]
    known = all(u is not None for u in uniques)
    unique_total = sum(uniques) if known else None  # type: ignore[arg-type]
    seen_total = math.fsum(r.seen_tokens for r in rows) if known else None  # type: ignore[misc]
    threshold, source = epoch_threshold(diffusion)
    return Repetition(
        datasets=tuple(rows), drawn_tokens=int(drawn_tokens), unique_tokens=unique_total, seen_tokens=seen_total,
        epochs=(drawn_tokens / unique_total) if unique_total else None, threshold=threshold, source=source,
        diffusion=diffusion, unknown=tuple(r.data.why for r in rows if r.data.why),
    )


def train_caps(entries: Sequence[Any]) -> dict[str, int]:
    """``{prefix: max_unique_tokens}`` of the ``data.train`` entries that set a cap (what the
    runtime's ``DataConfig.max_unique_tokens`` holds); empty when none does."""
    return {str(e.prefix): int(e.max_unique_tokens) for e in entries
            if getattr(e, "max_unique_tokens", None) is not None}


def repetition(spec: Any, resolved: Any) -> Repetition | None:
    """The :class:`Repetition` of a resolved spec (``spec``: :class:`~dlmspec.spec.models.Spec`,
    ``resolved``: :class:`~dlmspec.resolve.Resolved`); None with mock data, no training data, or
    a stage other than pre-training (an SFT or RL stage reads its data one conversation or prompt
    per sample, which this arithmetic does not describe). Reads each dataset's ``.idx`` (or
    record) on this machine."""
    from dlmspec import objectives

    if spec.data.mock or not resolved.train_blend.shards or spec.stage.kind != "pretrain":
        return None
    caps = train_caps(spec.data.train)
    split = None if spec.data.valid else spec.data.split
    try:
        split_vector(split) if split is not None else None
    except ValueError:
        return None  # the split-format rule says why
    cache: dict[tuple[str, int | None], DatasetTokens] = {}
    datasets = []
    for shard in resolved.train_blend.shards:
        cap = caps.get(shard.prefix) if shard.prefix == shard.entry else None
        key = (shard.prefix, cap)
        if key not in cache:
            cache[key] = dataset_tokens(shard.prefix, split=split, cap=cap, entry=shard.entry)
        datasets.append((cache[key], float(shard.weight)))
    drawn = int(resolved.train_iters) * int(spec.train.global_batch_size) * int(spec.train.seq_length)
    return repeat(datasets, drawn, diffusion=bool(objectives.get(spec.objective.kind).diffusion))


def _tokens(n: float | None) -> str:
    if n is None:
        return "unknown"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return f"{int(round(n))}"


def repetition_lines(rep: Repetition) -> list[str]:
    """What ``plan`` and ``show`` print: one line per dataset (tokens after the cap, drawn,
    epochs, unique seen), the run's totals, the unknown counts with why, and the note when a
    dataset passes the literature's threshold."""
    lines = [f"training data: {_tokens(rep.drawn_tokens)} tokens drawn (train_iters x global_batch_size x "
             "seq_length), by blend weight"]
    for d in rep.datasets:
        cap = f" (max_unique_tokens {d.data.cap:,}: {d.data.kept_documents:,} documents)" if (
            d.data.cap is not None and d.data.kept_documents is not None) else (
            f" (max_unique_tokens {d.data.cap:,})" if d.data.cap is not None else "")
        epochs = "unknown" if d.epochs is None else f"{d.epochs:,.2f}"
        lines.append(f"  {d.data.prefix}: {_tokens(d.data.unique_tokens)} unique tokens{cap}, weight "
                     f"{d.weight:.3f}, draws {_tokens(d.drawn_tokens)}, {epochs} epochs, "
                     f"{_tokens(d.seen_tokens)} unique seen")
    epochs = "unknown" if rep.epochs is None else f"{rep.epochs:,.2f}"
    lines.append(f"  total: {_tokens(rep.unique_tokens)} unique tokens, {_tokens(rep.drawn_tokens)} drawn, "
                 f"{epochs} epochs, {_tokens(rep.seen_tokens)} unique seen")
    for why in rep.unknown:
        lines.append(f"  unknown: {why}")
    for d in rep.over:
        lines.append(f"note: {d.data.prefix} is repeated {d.epochs:,.1f} epochs, past the ~{rep.threshold:g} "
                     f"{'a diffusion' if rep.diffusion else 'an AR'} objective is reported to use well "
                     f"({rep.source})")
    return lines
