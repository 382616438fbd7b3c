"""Spec shorthands expanded before validation, shared by the pydantic models (:mod:`dlmspec.spec.models`)
and the pydantic-free checker (:mod:`dlmspec.spec.fast`), so both read a spec the same way.
Imports nothing outside the standard library."""

from __future__ import annotations

from typing import Any


def prefix_strings(data: Any) -> Any:
    """``[data] train = ["prefix", ...]`` (and ``valid``) as weight-1 entries ``{"prefix": ...}``.

    Returns ``data`` unchanged when it is not a table; never mutates its input.
    """
    if isinstance(data, dict):
        data = dict(data)
        for key in ("train", "valid"):
            if isinstance(data.get(key), list):
                data[key] = [{"prefix": e} if isinstance(e, str) else e for e in data[key]]
    return data
