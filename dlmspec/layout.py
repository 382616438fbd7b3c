"""The one derivation of a run's layout: data-parallel sizes, microbatches and the divisibility
rules between them.

Every caller uses these functions and nothing else: :func:`dlmspec.resolve.resolve` (the spec's
values), :func:`dlmspec.plan.shape.relayout` (a layout the planner changes),
:func:`dlmspec.plan.search.enumerate_layouts` (thousands of layouts screened as integer tests)
and the runtime's :mod:`dlmspec.backends.megatron.checks` (which refuses what does not divide).
Pure integer arithmetic: no pydantic, no torch, importable by both sides.

Sources: megatron-core ``parallel_state.initialize_model_parallel`` (``world_size`` divisible by
TP x PP x CP and by expert TP x EP x PP; data parallel = world / (TP x PP x CP), expert data
parallel = world / (ETP x EP x PP)) and Megatron-LM's microbatch calculator
(``num_microbatches = global_batch_size / (micro_batch_size x data_parallel_size)``, refused when
it does not divide). Sizes are counts of GPUs (processes); batch sizes are counts of sequences.
"""

from __future__ import annotations

from typing import NamedTuple


class LayoutSizes(NamedTuple):
    """The sizes a layout derives.

    Attributes:
        dp: data-parallel size, world / (tp * pp * cp).
        expert_dp: expert data-parallel size, world / (etp * ep * pp).
        num_microbatches: microbatches per step per data-parallel rank, gbs / (mbs * dp).
    """

    dp: int
    expert_dp: int
    num_microbatches: int


def data_parallel_size(world_size: int, tp: int, pp: int, cp: int) -> int:
    """``world_size // (tp * pp * cp)``, at least 1 (a world that does not divide is reported by
    :func:`world_problem`; this still returns a usable size so later values can be derived)."""
    return max(1, world_size // (tp * pp * cp))


def expert_data_parallel_size(world_size: int, etp: int, ep: int, pp: int) -> int:
    """``world_size // (etp * ep * pp)``, at least 1 (see :func:`expert_world_problem`)."""
    return max(1, world_size // (etp * ep * pp))


def num_microbatches(global_batch_size: int, micro_batch_size: int, dp: int) -> int:
    """``global_batch_size // (micro_batch_size * dp)``, at least 1 (a batch that does not divide
    is reported by :func:`batch_problem`)."""
    return max(1, global_batch_size // (micro_batch_size * dp))


def derive(world_size: int, *, tp: int, pp: int, cp: int, ep: int, etp: int,
           global_batch_size: int, micro_batch_size: int) -> LayoutSizes:
    """:class:`LayoutSizes` of one layout (each value floored at 1; the ``*_problem`` functions
    say whether it divides exactly)."""
    dp = data_parallel_size(world_size, tp, pp, cp)
    return LayoutSizes(dp, expert_data_parallel_size(world_size, etp, ep, pp),
                       num_microbatches(global_batch_size, micro_batch_size, dp))


def world_divides(world_size: int, tp: int, pp: int, cp: int) -> bool:
    """``world_size % (tp * pp * cp) == 0`` (megatron-core ``initialize_model_parallel``)."""
    return world_size % (tp * pp * cp) == 0


def expert_world_divides(world_size: int, etp: int, ep: int, pp: int) -> bool:
    """``world_size % (etp * ep * pp) == 0`` (megatron-core ``initialize_model_parallel``)."""
    return world_size % (etp * ep * pp) == 0


def batch_divides(global_batch_size: int, micro_batch_size: int, dp: int) -> bool:
    """``global_batch_size % (micro_batch_size * dp) == 0`` (Megatron-LM's microbatch calculator)."""
    return global_batch_size % (micro_batch_size * dp) == 0


def world_problem(world_size: int, tp: int, pp: int, cp: int) -> str | None:
    """Why the world does not split into TP x PP x CP groups, or None when it does."""
    if world_divides(world_size, tp, pp, cp):
        return None
    return f"world size {world_size} not divisible by tp*pp*cp={tp * pp * cp}"


def batch_problem(global_batch_size: int, micro_batch_size: int, dp: int) -> str | None:
    """Why the global batch is not a whole number of microbatches per data-parallel rank, or None."""
    if batch_divides(global_batch_size, micro_batch_size, dp):
        return None
    return (f"global_batch_size {global_batch_size} not a multiple of micro_batch_size * "
            f"data_parallel_size = {micro_batch_size * dp}")
