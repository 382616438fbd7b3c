"""megatron-core's modules without ``megatron/core/__init__.py``, for the commands that need a few of
them and no model (``data prepare`` and ``task make --prepare-data``: the indexed-dataset writer and
the tokenizers).

``megatron/core/__init__.py`` imports most of the library (tensor_parallel, transformer, inference,
wandb): ~4.5 s of CPU, where the indexed-dataset writer needs ~0.6 s beyond torch and the tokenizers
~0.7 s. Inside :func:`without_megatron_core_init`, when ``megatron.core`` is not imported yet, a bare
package of the same folder stands in for it (``parallel_state`` imported first, as the library's
``__init__`` orders them through ``tensor_parallel``); on leaving, the stand-in and every
``megatron.core`` module imported under it leave ``sys.modules``, so that a later ``import
megatron.core`` runs the library's ``__init__`` in full (what was built inside keeps its own modules).
Nothing here imports torch or megatron at module level.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from typing import Iterator

__all__ = ["without_megatron_core_init"]


def _forget(stand_in: types.ModuleType, before: set[str]) -> None:
    for name in set(sys.modules) - before:
        if name == "megatron.core" or name.startswith("megatron.core."):
            del sys.modules[name]
    if sys.modules.get("megatron.core") is stand_in:
        del sys.modules["megatron.core"]
    parent = sys.modules.get("megatron")
    if parent is not None and getattr(parent, "core", None) is stand_in:
        delattr(parent, "core")


@contextlib.contextmanager
def without_megatron_core_init() -> Iterator[bool]:
    """Yields ``True`` with the stand-in in place (see the module docstring): imports of
    ``megatron.core.X`` inside load X and what it imports, not the library's ``__init__``. Yields
    ``False`` when ``megatron.core`` is imported already, or megatron-core cannot be found or
    does not import this way (another layout): the caller then imports as usual, outside."""
    if "megatron.core" in sys.modules:
        yield False
        return
    before = set(sys.modules)
    stand_in = types.ModuleType("megatron.core")
    try:
        found = importlib.util.find_spec("megatron.core")
        ready = found is not None and bool(found.submodule_search_locations)
        if ready:
            stand_in.__path__ = list(found.submodule_search_locations)
            sys.modules["megatron.core"] = stand_in
            import megatron.core.parallel_state  # noqa: F401  (before utils: the library's import cycle)
    except Exception:  # noqa: BLE001 - the caller's usual import decides (and raises what is missing)
        ready = False
    if not ready:
        _forget(stand_in, before)
        yield False
        return
    try:
        yield True
    finally:
        _forget(stand_in, before)
