"""Objectives as plugins, runtime side: :mod:`.base` (``ObjectiveBatch``, ``ObjectiveRng``, the
registry, the loss reductions), :mod:`.mdm` (masked diffusion), :mod:`.ar` (next-token
prediction), :mod:`.bd3lm` (block diffusion). Compiler halves: :mod:`dlmspec.objectives`."""

from .base import (LOSS_NORMALIZATIONS, PER_MICRO_BATCH, ObjectiveBatch, ObjectiveRng, RuntimeObjective,
                   apply_loss_normalization, build_from_config, loss_triple, reduce_loss, register_runtime,
                   runtime_kinds, unregister_runtime)

# the built-ins register themselves on import
from . import ar, bd3lm, mdm  # noqa: E402,F401

__all__ = ["LOSS_NORMALIZATIONS", "PER_MICRO_BATCH", "ObjectiveBatch", "ObjectiveRng", "RuntimeObjective",
           "apply_loss_normalization", "build_from_config", "loss_triple", "reduce_loss", "register_runtime",
           "runtime_kinds", "unregister_runtime"]
