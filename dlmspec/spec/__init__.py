"""The spec: what a user writes, read and checked against the schema (the first step of
spec -> resolve -> check -> plan -> render).

:mod:`dlmspec.spec.models` (the pydantic models: the schema), :mod:`dlmspec.spec.load` (TOML and
Python files, ``extends``, ``--set``, with each key's file and line), :mod:`dlmspec.spec.dotted`
(dotted keys, merging, nesting limits), :mod:`dlmspec.spec.fast` (the check of a plainly valid spec
without pydantic, generated from the models), :mod:`dlmspec.spec.presets` (model presets) and
:mod:`dlmspec.spec.shorthands`.

``from dlmspec.spec.models import Spec, ModelSpec, ...`` (what Python specs write) gives the models: they
are imported on first use, so that ``import dlmspec.spec.load`` (``dlmspec validate``) does not
import pydantic.
"""

from typing import Any

_SUBMODULES = frozenset({"models", "load", "dotted", "fast", "presets", "shorthands"})


def __getattr__(name: str) -> Any:
    """The public names of :mod:`dlmspec.spec.models` (``Spec``, ``ModelSpec``, ...)."""
    if name.startswith("_") or name in _SUBMODULES:
        raise AttributeError(name)  # a submodule not imported yet: the import system imports it
    from dlmspec.spec import models  # lazy: the models import pydantic (see the module docstring)

    try:
        return getattr(models, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
