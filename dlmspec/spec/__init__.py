"""The spec: what a user writes, read and checked against the schema (the first step of
spec -> resolve -> check -> plan -> render).

:mod:`dlmspec.spec.models` (the pydantic models: the schema), :mod:`dlmspec.spec.load` (TOML and
Python files, ``extends``, ``--set``, with each key's file and line; its parts
:mod:`~dlmspec.spec.read`, :mod:`~dlmspec.spec.lines`, :mod:`~dlmspec.spec.python_load`,
:mod:`~dlmspec.spec.sweep`, :mod:`~dlmspec.spec.schema_errors`, :mod:`~dlmspec.spec.show`),
:mod:`dlmspec.spec.dotted` (dotted keys, merging, nesting limits), :mod:`dlmspec.spec.fast` (the
check of a plainly valid spec without pydantic, its table :mod:`dlmspec.spec.fast_schema` generated
from the models by :mod:`dlmspec.spec.fast_build`), :mod:`dlmspec.spec.presets` (model presets) and
:mod:`dlmspec.spec.shorthands`.

``from dlmspec.spec.models import Spec, ModelSpec, ...`` (what Python specs write) gives the models: they
are imported on first use, so that ``import dlmspec.spec.load`` (``dlmspec validate``) does not
import pydantic.
"""

from typing import Any

_SUBMODULES = frozenset({"models", "load", "dotted", "fast", "fast_schema", "fast_build", "presets", "shorthands",
                         "read", "lines", "python_load", "sweep", "schema_errors", "show", "names", "python"})


def __getattr__(name: str) -> Any:
    """The public names of :mod:`dlmspec.spec.models` (``Spec``, ``ModelSpec``, ...)."""
    if name.startswith("_") or name in _SUBMODULES:
        raise AttributeError(name)  # a submodule not imported yet: the import system imports it
    from dlmspec.spec import models  # lazy: the models import pydantic (see the module docstring)

    try:
        return getattr(models, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
