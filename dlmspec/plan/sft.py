"""What an SFT stage (``[stage] kind = "sft"``) plans differently from pre-training: padding waste.

Pre-training fills every position of a sequence with text. SFT puts conversations into
sequences of ``train.seq_length`` either one per sequence followed by EOS padding (padded) or
back to back (packed: ``stage.sft.packed_sequence``, backends/megatron/sft.py): a padded sequence
holds ``min(L, s)`` conversation tokens of ``s`` positions, so the GPU runs at the planned speed
over positions while the real (non-padding) tokens per second are that fraction of it. Memory and
step time are those of the same shapes (every sequence has ``s`` positions); only the token
counts change, and with them the tokens/s and the time a token budget takes.

The mean conversation length ``L`` comes from each training dataset's record
(``PREFIX.dlmspec.json``, :func:`dlmspec.data.record.read_record`: ``tokens / documents``, one
document per conversation, or the ``"sft"`` section's prompt and response tokens over the rows
written), weighted by the blend's weights; without a record it is an assumption
(:data:`ASSUMED_MEAN_FRACTION` of ``seq_length``), said so in the plan.

Spec keys read (``[stage.sft]``, read with defaults since the section is still growing):
``packed_sequence`` (bool; also accepted: ``packing``/``pack_sequences`` as a bool or
``"pack"``/``"pad"``), default padded; ``pad_eos_tokens`` (None: every padding EOS supervised).
Packing, or MDM padding partly supervised, passes a segment mask whose memory the memory model
counts (``ModelShape.segment_mask``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dlmspec import objectives
from dlmspec.resolve.blend import record_mean  # noqa: F401 - read by resolve; kept importable here

#: Mean conversation length assumed without a dataset record, as a fraction of ``seq_length``:
#: half the sequence, an assumption (not a measurement) the plan states.
ASSUMED_MEAN_FRACTION = 0.5

#: ``[stage.sft]`` names read for packing, first found wins.
PACKING_KEYS = ("packed_sequence", "packing", "pack_sequences")


@dataclass
class SftPlan:
    """The token counts of an SFT stage.

    Attributes:
        packed: conversations packed (True) or one per sequence, padded (False).
        packing_key: the ``stage.sft`` key that said so, or ``None`` (the default: padded).
        mean_sample_tokens: mean tokens of a conversation (EOD included).
        source: where ``mean_sample_tokens`` comes from: ``"record"`` or ``"assumed"``.
        sources: one line per training dataset (its record, or why it has none).
        response_fraction: response tokens / conversation tokens from the records (None without).
        real_fraction: real (non-padding) tokens per sequence position, in (0, 1].
        positions_per_second: sequence positions per second (the plan's tokens/s).
        real_tokens_per_second: ``positions_per_second * real_fraction``.
        response_tokens_per_second: real tokens/s that are response tokens (None without records).
        real_tokens_to_train: real tokens the run's ``train_iters`` steps see.
        train_tokens: ``train.train_tokens`` when the spec sets its budget in tokens, else None.
        iters_for_train_tokens, seconds_for_train_tokens: the steps and time ``train_tokens``
            real tokens take at ``real_fraction`` (None without ``train_tokens``).
    """

    packed: bool
    packing_key: str | None
    mean_sample_tokens: float
    source: str
    sources: list[str] = field(default_factory=list)
    response_fraction: float | None = None
    real_fraction: float = 1.0
    positions_per_second: float = 0.0
    real_tokens_per_second: float = 0.0
    response_tokens_per_second: float | None = None
    real_tokens_to_train: float = 0.0
    train_tokens: int | None = None
    iters_for_train_tokens: int | None = None
    seconds_for_train_tokens: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``sft`` object of :meth:`dlmspec.plan.Plan.to_dict` (keys as the attributes)."""
        return {
            "packed": self.packed,
            "packing_key": self.packing_key,
            "mean_sample_tokens": self.mean_sample_tokens,
            "mean_sample_source": self.source,
            "sources": list(self.sources),
            "response_fraction": self.response_fraction,
            "real_fraction": self.real_fraction,
            "positions_per_second": self.positions_per_second,
            "real_tokens_per_second": self.real_tokens_per_second,
            "response_tokens_per_second": self.response_tokens_per_second,
            "real_tokens_to_train": self.real_tokens_to_train,
            "train_tokens": self.train_tokens,
            "iters_for_train_tokens": self.iters_for_train_tokens,
            "seconds_for_train_tokens": self.seconds_for_train_tokens,
        }


def sft_key(sft: Any, key: str) -> Any:
    """``[stage.sft]`` value ``key``, or None when the section (or the key) is absent. Read from
    the object's own fields, never through ``getattr``'s fallback: a fast-loaded spec
    (:mod:`dlmspec.spec.fast`) answers an unknown name by building its pydantic model."""
    if sft is None:
        return None
    fields = getattr(sft, "__dict__", None)
    if isinstance(fields, dict):
        return fields.get(key)
    return getattr(sft, key, None)


def packing(sft: Any) -> tuple[bool, str | None]:
    """``(packed, key)`` from a ``[stage.sft]`` section (or None): the first of
    :data:`PACKING_KEYS` it has; padded when it has none."""
    for key in PACKING_KEYS:
        value = sft_key(sft, key)
        if value is None:
            continue
        if isinstance(value, str):
            return value.lower() in ("pack", "packed", "true"), key
        return bool(value), key
    return False, None


def needs_segment_mask(sft: Any, objective_kind: str) -> bool:
    """Whether an SFT stage's batches carry a ``[b, 1, s, s]`` segment mask: packed sequences, or
    masked-diffusion padding of which only ``pad_eos_tokens`` are supervised (the rest is a
    segment of its own) - ``backends/megatron/sft.py`` ``needs_attention_mask``. ``sft`` is the
    ``[stage.sft]`` section or None; keys read with defaults."""
    if packing(sft)[0]:
        return True
    return objectives.get(objective_kind).unsupervised_padding_segment(sft_key(sft, "pad_eos_tokens"))


def real_fraction(mean: float, seq: int, packed: bool) -> float:
    """Real (non-padding) tokens per sequence position for conversations of mean length ``mean``
    in sequences of ``seq`` positions: padded, ``min(mean, seq) / seq`` (one conversation per
    sequence, over-long ones cut or skipped); packed (greedy, a conversation never split), the
    tail a sequence leaves when the next conversation does not fit is taken as half a mean
    conversation: ``1 - min(mean, seq) / (2 * seq)``, never below the padded fraction. Both use the
    mean only (a length distribution would refine them)."""
    used = min(mean, float(seq))
    padded = used / seq
    return padded if not packed else max(padded, 1.0 - used / (2.0 * seq))


def sft_plan(resolved: Any, positions_per_second: float, step_seconds: float, tokens_per_step: int) -> SftPlan | None:
    """The :class:`SftPlan` of ``resolved`` (None unless ``stage.kind = "sft"``).

    Args:
        resolved: the resolved spec.
        positions_per_second: the plan's tokens/s (sequence positions).
        step_seconds: the plan's step time.
        tokens_per_step: ``global_batch_size * seq_length`` positions per step.
    """
    spec = resolved.spec
    if spec.stage.kind != "sft":
        return None
    seq = spec.train.seq_length
    packed, key = packing(spec.stage.sft)
    means, weights, fracs, notes = [], [], [], []
    # the resolved blend: globs and manifests of data.train expanded into shards (dlmspec.resolve.resolve_blend)
    shards = resolved.train_blend.pairs()
    # each shard's record, read by dlmspec.resolve.resolve (Resolved.record_means)
    read = {prefix: (mean, frac, note) for prefix, mean, frac, note in resolved.record_means}
    for prefix, weight in shards:
        mean, frac, note = read.get(prefix) or record_mean(prefix)
        notes.append(note)
        if mean is not None:
            means.append(mean)
            weights.append(weight)
            fracs.append(frac)
    if means and len(means) == len(shards):
        total = sum(weights)
        mean = sum(m * w for m, w in zip(means, weights)) / total
        source = "record"
        frac = sum(f * w for f, w in zip(fracs, weights)) / total if all(f is not None for f in fracs) else None
    else:
        mean, source, frac = ASSUMED_MEAN_FRACTION * seq, "assumed", None
        notes.append(f"assumed: a mean conversation of {ASSUMED_MEAN_FRACTION:g} x train.seq_length = {mean:,.0f} "
                     "tokens (not every training dataset has a record; `dlmspec data prepare --sft` writes one)")
    fraction = real_fraction(mean, seq, packed)
    iters = resolved.train_iters
    out = SftPlan(packed=packed, packing_key=key, mean_sample_tokens=mean, source=source, sources=notes,
                  response_fraction=frac, real_fraction=fraction, positions_per_second=positions_per_second,
                  real_tokens_per_second=positions_per_second * fraction,
                  response_tokens_per_second=positions_per_second * fraction * frac if frac is not None else None,
                  real_tokens_to_train=float(iters * tokens_per_step) * fraction)
    budget = getattr(spec.train, "train_tokens", None)
    if budget:
        out.train_tokens = int(budget)
        out.iters_for_train_tokens = max(1, math.ceil(budget / (tokens_per_step * fraction)))
        out.seconds_for_train_tokens = out.iters_for_train_tokens * step_seconds
    return out


def sft_lines(p: SftPlan, train_iters: int, to_train_seconds: float) -> list[str]:
    """The plan's SFT lines in words (:mod:`dlmspec.plan.report` prints them)."""
    how = (f"packed ({p.packing_key} = true)" if p.packed else
           f"padded, one conversation per sequence ({p.packing_key + ' = false' if p.packing_key else 'the default'})")
    lines = [
        f"SFT: {how}; mean conversation {p.mean_sample_tokens:,.0f} tokens ({p.source}): "
        f"{100 * p.real_fraction:.0f}% of the positions are real (non-padding) tokens",
        f"  {p.real_tokens_per_second:,.0f} real tokens/s of {p.positions_per_second:,.0f} positions/s"
        + (f", {p.response_tokens_per_second:,.0f} response tokens/s" if p.response_tokens_per_second is not None
           else ""),
        f"  {train_iters:,} steps see {p.real_tokens_to_train:,.0f} real tokens",
    ]
    if p.train_tokens and p.iters_for_train_tokens is not None and p.seconds_for_train_tokens is not None:
        lines[-1] += (f"; train.train_tokens = {p.train_tokens:,} real tokens would take {p.iters_for_train_tokens:,} "
                      f"steps ({_hours(p.seconds_for_train_tokens)}, against {_hours(to_train_seconds)} for the "
                      "steps train_tokens sets, which count positions)")
    lines += [f"  {note}" for note in p.sources]
    return lines


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.1f} min"
