"""Values of the training stage with their defaults filled: ``[stage.sft]``, the padding EOS an
SFT sample supervises, why its batches carry a mask, and the loss normalisation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dlmspec import objectives, stages
from dlmspec.spec.fast import section_defaults

if TYPE_CHECKING:
    from dlmspec.spec.models import Spec


def sft_section(spec: Spec) -> Any:
    """``[stage.sft]`` with its defaults filled (``SFTSpec()`` where the spec has no such table)."""
    sft = spec.stage.sft
    return sft if sft is not None else section_defaults(spec, "SFTSpec")


def sft_pad_eos_tokens(spec: Spec) -> int | None:
    """The padding EOS an SFT sample supervises (``stage.sft.pad_eos_tokens``; ``None``: all;
    unset: :func:`dlmspec.stages.sft_pad_eos_tokens`'s default of the objective)."""
    return stages.sft_pad_eos_tokens(sft_section(spec), spec.objective.kind)


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
    """What the ``[stage] kind``'s registration (:mod:`dlmspec.stages`) keeps for train.py
    (``Resolved.stage_values``): its ``resolve_values(spec, table)``, ``table`` being its
    ``[stage.<section>]`` with defaults filled (sft: the table and the resolved
    ``pad_eos_tokens``); ``None`` for a kind that keeps none or is not registered (``validate``
    refuses it)."""
    entry = stages.stage_kind(spec.stage.kind)
    if entry is None or entry.resolve_values is None:
        return None
    table = None
    if entry.section is not None:
        name, model = entry.section
        table = getattr(spec.stage, name, None)
        if table is None:
            table = section_defaults(spec, model)
    return entry.resolve_values(spec, table, lambda model: section_defaults(spec, model))
