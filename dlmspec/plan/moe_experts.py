"""Kernel launches of the routed experts of one MoE layer and microbatch: megatron-core's
``SequentialMLP`` (one expert after the other) against grouped GEMM (``model.moe_grouped_gemm``).

``SequentialMLP`` (``megatron/core/transformer/moe/experts.py``) loops over the rank's local
experts, each an MLP of its own: fc1, the activation and fc2 forward, and their backward, one
launch each, :data:`dlmspec.plan.launches.KERNELS_PER_LOCAL_EXPERT` per expert (counted on both
paths). On a fine-grained MoE (128 experts, top-8, each expert's share of a micro-batch a few
hundred rows) these launches make the step host-bound.

Grouped GEMM, per MoE layer and microbatch:

* Transformer Engine (``TEGroupedMLP``: ``GroupedLinear`` fc1 and fc2): Transformer Engine's
  ``general_grouped_gemm`` issues one cuBLAS GEMM per expert, spread over several streams, for each
  forward GEMM (2) and each backward's input and weight gradient (4), plus the per-expert casts and
  bookkeeping around them. :data:`GROUPED_PER_LOCAL_EXPERT` keeps the measured value, 12 per expert
  and nothing per layer: the grouped-GEMM run ``te-moe-e8-top2-mb4`` (bench/calibration/te/h200/,
  8 experts) is fitted with it, and the public measurements' calibration split
  (bench/calibration/public/: Qwen3-30B-A3B, 16 experts per rank) agrees with it; a count of
  6 per expert plus 48 per layer (the GEMMs alone) planned those points 12-16% faster than measured.
* megatron-core's ``GroupedMLP`` on the local path (the ``grouped_gemm`` package's CUTLASS grouped
  kernel, one launch per GEMM over all experts): no per-expert launches. dlmspec's local layers do
  not build it (rule ``runtime-grouped-gemm-local``); it is counted for completeness.

These constants are counted from the code, not fitted: uncalibrated beyond the one 8-expert run
until a fine-grained MoE (the 128-expert, top-8 model) has been measured with and without grouped
GEMM on a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dlmspec.plan.shape import Layout, ModelShape

#: Launches per local expert with grouped GEMM, by layer path (see the module docstring).
GROUPED_PER_LOCAL_EXPERT = {"transformer_engine": 12, "local+sdpa": 0}
#: Launches per MoE layer with grouped GEMM besides the per-expert ones (Transformer Engine: none
#: beyond the measured per-expert count, see the module docstring; local: counted).
GROUPED_PER_MOE_LAYER = {"transformer_engine": 0, "local+sdpa": 10}


def local_experts(shape: "ModelShape", lay: "Layout") -> float:
    """Routed experts on one rank: ``num_experts / expert_model_parallel_size``."""
    return shape.num_experts / lay.ep


def expert_kernels(shape: "ModelShape", lay: "Layout", path: str, sequential_per_expert: int) -> float:
    """Launches of the routed experts of one MoE layer and microbatch on ``path``:
    ``sequential_per_expert`` per local expert for ``SequentialMLP``; with ``lay.moe_grouped_gemm``
    :data:`GROUPED_PER_MOE_LAYER` plus :data:`GROUPED_PER_LOCAL_EXPERT` per local expert."""
    n = local_experts(shape, lay)
    if getattr(lay, "moe_grouped_gemm", False):
        return GROUPED_PER_MOE_LAYER[path] + GROUPED_PER_LOCAL_EXPERT[path] * n
    return sequential_per_expert * n
