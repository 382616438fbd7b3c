"""Megatron-LM's theoretical memory formula, for comparison with the planner.

A re-implementation (not a copy) of the arithmetic in Megatron-LM's
``megatron/training/theoretical_memory_usage.py`` (NVIDIA, 2023; functions
``compute_weight_and_optimizer_memory``, ``compute_activation_memory`` and
``compute_activation_memory_without_sp``, as ``report_theoretical_memory`` chooses between
them), restricted to what dlmspec models (no multi-latent attention, no multi-token
prediction). Megatron-LM prints it at start-up; ``docs/planner-methods.md`` lists it next to the
planner and the GPU measurements.

What it assumes, and where the planner differs:

* weights + optimizer: the most loaded shard (first stage: ``L/pp`` layers + the embedding,
  all divided by TP, plus the output layer when untied and ``pp = 1``), times 18 bytes per
  parameter (2 weight + 4 fp32 gradient + 12 Adam) or ``6 + 12/dp`` with the distributed
  optimizer. The planner counts replicated norms/biases per TP rank and shards over
  ``dp * cp``.
* activations, with sequence parallelism and selective recomputation: Korthikanti et al. 2022,
  Table 2, ``s*b*h*(18 + 4*f/h)`` per layer (the ``5*a*s/h`` attention term removed by
  recomputation; GQA, SwiGLU's wider fc1 and flash attention are not modelled); otherwise
  ``s*b*h*(10 + 24/t)`` per layer and 5% overhead. Both add the embedding's input and dropout
  for ``pp`` in-flight microbatches, multiply by the interleaving penalty
  ``1 + (pp-1)/(pp*vpp)``, and count the logits only when ``pp = 1``. Context parallelism and
  recomputation other than ``selective`` are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlmspec.plan.shape import Layout, ModelShape


@dataclass(frozen=True)
class MegatronEstimate:
    """Megatron-LM's theoretical memory per GPU, bytes.

    Attributes:
        weight_and_optimizer_bytes: ``compute_weight_and_optimizer_memory``.
        activation_bytes: ``compute_activation_memory`` (SP + selective) or
            ``compute_activation_memory_without_sp``.
        total_bytes: their sum (what Megatron-LM prints as ``total``).
        formula: which activation formula applied (``"sp_selective"`` or ``"without_sp"``).
    """

    weight_and_optimizer_bytes: float
    activation_bytes: float
    total_bytes: float
    formula: str


def megatron_weight_and_optimizer_bytes(shape: ModelShape, lay: Layout) -> float:
    """Megatron-LM ``compute_weight_and_optimizer_memory`` in bytes (see the module docstring)."""
    h, a, g, d = shape.hidden, shape.heads, shape.groups, shape.head_dim
    gated = 1.5 if shape.gated else 1.0
    norm = 2 if shape.layernorm else 1
    self_attn = 2 * h * h * ((1 + g / a) * (d * a / h))
    dense_layer = 2 * h * (shape.ffn * gated + norm) + self_attn
    n_moe = sum(shape.moe_layers) if shape.is_moe else 0
    n_dense = shape.num_layers - n_moe
    experts = shape.num_experts if shape.is_moe else 1
    moe_layer = 2 * h * (shape.expert_ffn * experts * gated + shape.shared_ffn * gated + norm) + self_attn
    embedding = h * shape.vocab
    block = dense_layer * n_dense + moe_layer * n_moe + norm * h
    most_loaded = (block / lay.pp + embedding) / lay.tp
    if not shape.tied and lay.pp == 1:
        most_loaded += embedding / lay.tp
    per_param = 6 + 12 / lay.dp if lay.distributed_optimizer else 18
    return most_loaded * per_param


def megatron_activation_bytes(shape: ModelShape, lay: Layout) -> tuple[float, str]:
    """Megatron-LM's activation estimate in bytes and which formula ``report_theoretical_memory``
    picks: ``compute_activation_memory`` when sequence parallelism and selective recomputation
    are both on, else ``compute_activation_memory_without_sp``."""
    s, b, h, t, p = lay.seq, lay.micro_batch, shape.hidden, lay.tp, lay.pp
    v = lay.vpp if lay.vpp > 1 else None
    m = lay.num_microbatches
    if lay.sp and lay.recompute == "selective":
        act = s * b * h * (18 + 4 * shape.ffn / h) * shape.num_layers
        act += 8 * s * b * p + s * b * h * p
        if v is not None:
            act *= 1 + (p - 1) / (p * v)
        if v is None and p > 1:
            act *= min(1, m / p)
        if p == 1:
            act += s * b * h * 4 * (1 + shape.vocab / h)
        return act / t, "sp_selective"
    act = s * b * h * (10 + 24 / t) * shape.num_layers
    act += 8 * s * b * p + s * b * h * p
    if v is not None:
        act *= 1 + (p - 1) / (p * v)
    if v is None and p > 1:
        act *= min(1, m / p)
    if p == 1:
        act += (s * b * shape.vocab / t + s * b * h) * 2
    return act * 1.05, "without_sp"


def megatron_estimate(shape: ModelShape, lay: Layout) -> MegatronEstimate:
    """Both halves of Megatron-LM's theoretical memory for ``(shape, lay)``."""
    weights = megatron_weight_and_optimizer_bytes(shape, lay)
    acts, formula = megatron_activation_bytes(shape, lay)
    return MegatronEstimate(weights, acts, weights + acts, formula)


def in_flight_interleaved_megatron(pp: int, vpp: int) -> int:
    """Megatron-LM's in-flight microbatch count for the interleaved schedule,
    ``ceil((1 + (pp-1)/(pp*vpp)) * pp)`` (printed with ``verbose``)."""
    return math.ceil((1 + (pp - 1) / (pp * vpp)) * pp)
