"""Which transformer layers each pipeline rank holds and how many microbatches of them it keeps
in flight: the pipeline schedule's share of the memory plan (:mod:`dlmspec.plan.memory` uses it;
the split itself is :mod:`dlmspec.pipeline_split`, megatron-core's rules).
"""

from __future__ import annotations

from functools import lru_cache

from dlmspec.pipeline_split import Split, chunk_layers, layer_ranges
from dlmspec.plan.shape import Layout, ModelShape, pipeline_split


def stage_layer_counts(shape: ModelShape, lay: Layout, stage: int) -> tuple[int, int]:
    """(dense layers, MoE layers) held by pipeline rank ``stage``.

    The layers of each of its virtual stages are :func:`dlmspec.pipeline_split.layer_ranges`'
    (megatron-core ``get_num_layers_to_build`` and ``get_transformer_layer_offset``): the even
    split (chunk ``c`` of rank ``i`` holds layers ``[(c*pp + i)*Lc, (c*pp + i + 1)*Lc)``,
    ``Lc = L / (pp*vpp)``), or the uneven one the spec sets (embedding/loss accounting, first/last
    stage counts, an explicit layout: :attr:`~dlmspec.plan.shape.Layout.pipeline_split`). A split
    megatron-core refuses gets a stand-in: the first ``L % pp`` ranks take one layer more.
    """
    return _layer_counts(shape.moe_layers if shape.is_moe else None, pipeline_split(shape, lay), stage)


@lru_cache(maxsize=8192)
def _layer_counts(pattern: tuple[int, ...] | None, split: Split, stage: int) -> tuple[int, int]:
    ranges = layer_ranges(split, stage)
    n = sum(b - a for a, b in ranges)
    moe = sum(sum(pattern[a:b]) for a, b in ranges) if pattern else 0
    return n - moe, moe


def heaviest_stage(shape: ModelShape, lay: Layout) -> int:
    """The first pipeline rank holding the most transformer layers (with an uneven split a middle
    rank can hold more than the first and the last)."""
    counts = [sum(stage_layer_counts(shape, lay, i)) for i in range(lay.pp)]
    return max(range(lay.pp), key=lambda i: (counts[i], -i))


def in_flight(lay: Layout, stage: int) -> float:
    """Microbatches of whole-stage activations rank ``stage`` holds at its peak.

    1F1B: ``min(pp - stage, m)`` (Narayanan et al. 2021, sec. 2.2.1; megatron-core
    ``get_forward_backward_func`` -> ``forward_backward_pipelining_without_interleaving``
    runs ``pp - stage - 1`` warm-up forwards, then one more before the first backward).
    Interleaved: ``(min(2*(pp-stage-1) + (vpp-1)*pp, m*vpp) + 1) / vpp`` (chunk-microbatches of
    ``1/vpp`` of the stage each; ``forward_backward_pipelining_with_interleaving``'s
    ``num_warmup_microbatches`` with ``microbatch_group_size_per_vp_stage = pp``).
    """
    pp, m, v = lay.pp, lay.num_microbatches, lay.vpp
    if pp == 1:
        return 1.0
    if v <= 1:
        return float(min(pp - stage, m))
    warmup = min(2 * (pp - stage - 1) + (v - 1) * pp, m * v)
    return min(warmup + 1, m * v) / v


def in_flight_layers(shape: ModelShape, lay: Layout, stage: int) -> float:
    """Microbatches of rank ``stage``'s transformer-layer activations held at its peak, in units of
    the whole stage: :func:`in_flight`, except under an uneven split with interleaving, where the
    virtual stages in flight hold different layer counts. There the interleaved schedule's
    ``W = min(warmup + 1, m*vpp)`` chunk-microbatches run in megatron-core's order (the ``k``-th is
    model chunk ``(k mod pp*vpp) // pp``: ``get_model_chunk_id`` with
    ``microbatch_group_size_per_vp_stage = pp``), and the result is the layers they hold over the
    stage's layers (for equal chunks ``W / vpp``, :func:`in_flight`'s value)."""
    flight = in_flight(lay, stage)
    if lay.pipeline_split is None or lay.vpp <= 1 or lay.pp == 1:
        return flight
    chunks = chunk_layers(pipeline_split(shape, lay))[stage]
    total = sum(chunks)
    if not total:
        return flight
    held = round(flight * lay.vpp)  # W chunk-microbatches
    group = lay.pp * lay.vpp
    return sum(chunks[(k % group) // lay.pp] for k in range(held)) / total
