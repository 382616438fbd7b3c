"""Objectives as plugins, compiler side: :mod:`dlmspec.objectives.base` (the registry),
:mod:`dlmspec.objectives.mdm` (masked diffusion), :mod:`dlmspec.objectives.ar` (next-token
prediction), :mod:`dlmspec.objectives.bd3lm` (block diffusion), :mod:`dlmspec.objectives.schedules` (masking schedules). The runtime halves:
:mod:`dlmspec.backends.megatron.objectives`."""

from dlmspec.objectives.base import (Objective, find, get, is_diffusion, kinds, kinds_text, register, template_options,
                                     unregister)

# the built-ins register themselves on import
from dlmspec.objectives import mdm  # noqa: E402,F401  (after base: they subclass it; mdm first, the default)
from dlmspec.objectives import ar  # noqa: E402,F401
from dlmspec.objectives import bd3lm  # noqa: E402,F401

__all__ = ["Objective", "find", "get", "is_diffusion", "kinds", "kinds_text", "register", "template_options",
           "unregister"]
