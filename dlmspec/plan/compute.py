"""FLOPs of a training step: the model FLOPs MFU is quoted in, and the hardware FLOPs the GPUs
actually execute (model FLOPs plus recomputation).

The counting rules (GEMMs, attention keys per mode, MoE active experts, logits) are
:mod:`dlmspec.flops`'s, stated there once.

:func:`model_flops_per_token` (MFU's numerator) lives in :mod:`dlmspec.flops`, which the runtime
imports too; this module adds the step's hardware FLOPs (recomputation) for a layout.
"""

from __future__ import annotations

from dataclasses import dataclass

# Re-exported: the planner's callers import them from here.
from dlmspec.flops import attended_keys, forward_flops_per_token, model_flops_per_token  # noqa: F401
from dlmspec.plan.shape import Layout, ModelShape, input_length, output_length


def shape_forward_parts(shape: ModelShape, seq: int, attention: str | None = None) -> dict[str, float]:
    """:func:`forward_flops_per_token` of a :class:`ModelShape` (optionally with another
    attention pattern, e.g. the FLOPs a kernel executes)."""
    return forward_flops_per_token(
        shape.num_layers, shape.hidden, shape.ffn, shape.heads, shape.groups, shape.head_dim, shape.vocab, seq,
        gated=shape.gated, attention=attention or shape.attention, block_size=shape.block_size or None,
        num_experts=shape.num_experts, moe_router_topk=shape.topk, moe_ffn_hidden_size=shape.expert_ffn,
        moe_shared_expert_intermediate_size=shape.shared_ffn, num_moe_layers=sum(shape.moe_layers) if shape.is_moe else 0,
        keys=shape.attended_keys or None,  # an objective's own mask (block diffusion): its density
    )


def shape_model_flops_per_token(shape: ModelShape, seq: int) -> float:
    """:func:`model_flops_per_token` of a :class:`ModelShape`."""
    return 3 * sum(shape_forward_parts(shape, seq).values())


@dataclass(frozen=True)
class FlopCounts:
    """FLOPs of one optimizer step over the whole job.

    Attributes:
        model_per_token: :func:`model_flops_per_token` (3x forward, no recomputation) per input
            position, the logits counted on the output rows (:func:`output_rows_scaled`).
        model_per_step: ``model_per_token * global_batch * input_length`` (``input_length``:
            :func:`~dlmspec.plan.shape.input_length`, ``seq`` plus the objective's extra positions).
        hardware_per_step: what the GPUs execute: model FLOPs with the attention kernel's
            actual work (block-causal on SDPA's masked kernel computes all ``s*s`` pairs) plus
            one more forward of everything recomputed.
        recompute_per_step: the recomputed forward FLOPs (part of ``hardware_per_step``).
        forward_parts: hardware forward FLOPs per token by part (for the time model).
    """

    model_per_token: float
    model_per_step: float
    hardware_per_step: float
    recompute_per_step: float
    forward_parts: dict[str, float]


def output_rows_scaled(parts: dict[str, float], shape: ModelShape, lay: Layout) -> dict[str, float]:
    """``parts`` (forward FLOPs per input position) with the output layer's ``logits`` counted on
    the rows that reach it: times ``output_length / input_length``
    (:func:`~dlmspec.plan.shape.output_length`; block diffusion without an AR loss: ``L / 2L``,
    the ``x_t`` half only). Other parts are unchanged; per input position, so that
    ``parts * global_batch * input_length`` is the step's."""
    share = output_length(shape, lay) / input_length(shape, lay)
    if share == 1 or "logits" not in parts:
        return parts
    return {**parts, "logits": parts["logits"] * share}


def hardware_forward_parts(shape: ModelShape, lay: Layout) -> dict[str, float]:
    """Forward FLOPs per input position the kernels execute: block-causal attention runs on SDPA's
    memory-efficient kernel with a boolean mask, which computes every ``(query, key)`` pair,
    so it costs as much as bidirectional attention; the logits on the output rows only
    (:func:`output_rows_scaled`)."""
    kernel_attention = shape.attention
    if shape.attention == "block_causal":
        kernel_attention = "bidirectional"
    return output_rows_scaled(shape_forward_parts(shape, input_length(shape, lay), kernel_attention), shape, lay)


def recompute_fraction(shape: ModelShape, lay: Layout) -> dict[str, float]:
    """Share of each forward part executed a second time by recomputation.

    ``full``/``uniform`` recomputes every layer; ``full``/``block`` the first
    ``recompute_num_layers`` layers of each (virtual) stage chunk; ``selective`` the named
    modules: ``core_attn`` -> the attention core, ``mlp`` -> dense MLPs, ``moe`` -> MoE layers,
    ``shared_experts`` -> the shared expert (its share of the MoE part); ``layernorm`` and
    ``moe_act`` recompute element-wise work only (no GEMM FLOPs).
    """
    zero = {"attention_linear": 0.0, "attention_core": 0.0, "mlp": 0.0, "moe": 0.0, "logits": 0.0}
    if lay.recompute == "full":
        chunks = lay.pp * max(1, lay.vpp)
        per_chunk = shape.num_layers / chunks
        share = 1.0 if lay.recompute_method == "uniform" else min(1.0, lay.recompute_layers / per_chunk)
        return {**zero, "attention_linear": share, "attention_core": share, "mlp": share, "moe": share}
    if lay.recompute == "selective":
        out = dict(zero)
        mods = lay.recompute_modules
        if "core_attn" in mods:
            out["attention_core"] = 1.0
        if "mlp" in mods:
            out["mlp"] = 1.0
        if "moe" in mods:
            out["moe"] = 1.0
        elif "shared_experts" in mods and shape.shared_ffn and shape.is_moe:
            mult = 3 if shape.gated else 2
            per_shared = mult * 2 * shape.hidden * shape.shared_ffn
            per_moe = 2 * shape.hidden * shape.num_experts + shape.topk * mult * 2 * shape.hidden * shape.expert_ffn + per_shared
            out["moe"] = per_shared / per_moe
        return out
    return zero


def step_flops(shape: ModelShape, lay: Layout) -> FlopCounts:
    """FLOPs of one optimizer step of the whole job (see :class:`FlopCounts`)."""
    tokens = lay.global_batch * input_length(shape, lay)  # input positions (train.seq_length + the objective's extra)
    # the output layer's GEMM on the rows that reach it (block diffusion without AR loss: x_t's L of 2L)
    model_tok = 3 * sum(output_rows_scaled(shape_forward_parts(shape, input_length(shape, lay)), shape, lay).values())
    fwd = hardware_forward_parts(shape, lay)
    frac = recompute_fraction(shape, lay)
    recompute_tok = sum(fwd[k] * frac[k] for k in fwd)
    # an objective's extra forward passes (a frozen teacher, a second view): forward only, no backward
    hardware_tok = (3 + shape.extra_forward_passes) * sum(fwd.values()) + recompute_tok
    return FlopCounts(
        model_per_token=model_tok,
        model_per_step=model_tok * tokens,
        hardware_per_step=hardware_tok * tokens,
        recompute_per_step=recompute_tok * tokens,
        forward_parts=fwd,
    )
