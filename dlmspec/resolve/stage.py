"""Values of the training stage with their defaults filled: ``[stage.sft]``, the padding EOS an
SFT sample supervises, why its batches carry a mask, and the loss normalisation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dlmspec import objectives
from dlmspec.spec.fast import section_defaults

if TYPE_CHECKING:
    from dlmspec.spec.models import Spec


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
    return None if objectives.get(spec.objective.kind).diffusion else 0


def sft_attention_mask(spec: Spec) -> str | None:
    """Why an SFT stage's batches carry an attention mask (``"key = value"``), else ``None``: packed
    conversations (a document mask) or masked-diffusion padding only partly supervised (the rest
    hidden from the conversation), as ``backends/megatron/sft.py needs_attention_mask``."""
    if spec.stage.kind != "sft":
        return None
    sft = sft_section(spec)
    if sft.packed_sequence:
        return "stage.sft.packed_sequence = true"
    if objectives.get(spec.objective.kind).unsupervised_padding_segment(sft_pad_eos_tokens(spec)):
        return f"stage.sft.pad_eos_tokens = {sft.pad_eos_tokens!r} with objective.kind = {spec.objective.kind!r}"
    return None


def default_loss_normalization(spec: Spec) -> str:
    """``train.loss_normalization`` when unset: ``"sequence"`` for an SFT stage of an mdm objective
    (LLaDA's SFT: each response's loss divided by its length, then the mean over responses, so a
    long answer does not outweigh a short one), else ``"global_token"``."""
    if spec.stage.kind == "sft" and objectives.get(spec.objective.kind).diffusion:
        return "sequence"
    return "global_token"


def stage_template_values(spec: Spec) -> dict[str, Any] | None:
    """What the ``[stage] kind``'s registration renders into train.py (``Resolved.stage_values``):
    for ``"sft"`` its ``[stage.sft]`` table with defaults filled and the resolved
    ``pad_eos_tokens``; ``None`` for other stages."""
    if spec.stage.kind != "sft":
        return None
    return {"section": sft_section(spec), "pad_eos_tokens": sft_pad_eos_tokens(spec)}
