"""Spec dicts by dotted key: ``--set`` values, ``extends`` merging, nesting limits. Shared by the
loader (:mod:`dlmspec.spec.load`), ``Spec.replace`` (:mod:`dlmspec.spec.models`) and ``dlmspec new``;
imports neither pydantic nor the models."""

from __future__ import annotations

import tomllib
from typing import Any

#: Deepest nesting of tables and arrays, the document counting as one level. Real specs reach 4
#: (``cluster.slurm.env.NAME``, ``data.train[0].prefix``); deeper input made the TOML parser,
#: the merge and pydantic raise RecursionError.
MAX_DEPTH = 32


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Return ``base`` updated by ``over``; tables merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for ``key = "a.b"``, creating tables on the way.

    Raises:
        ValueError: a prefix of ``key`` holds a non-table value, or ``key`` has more than
            :data:`MAX_DEPTH` parts.
    """
    parts = key.split(".")
    if len(parts) > MAX_DEPTH:
        raise TooDeep(nesting_message())
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ValueError(f"'{part}' is a value, not a table")
        node = child
    node[parts[-1]] = value


def flatten_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        keys.append(dotted)
        if isinstance(value, dict):
            keys.extend(flatten_keys(value, dotted + "."))
    return keys


class SetValueError(ValueError):
    """A ``--set`` value that cannot be read; ``hint`` says what works."""

    hint = ""


class TooDeep(SetValueError):
    """A ``--set`` value nested deeper than :data:`MAX_DEPTH` (see :func:`parse_set_value`)."""


class TooLong(SetValueError):
    """A ``--set`` value holding an integer of more digits than Python reads."""


def nesting_message() -> str:
    return (f"nested more than {MAX_DEPTH} levels deep (tables, dotted keys, arrays and inline tables "
            "together): spec keys nest at most 4 levels, and input this deep exhausts the parser's recursion")


def parse_set_value(text: str) -> Any:
    """Read the value of ``--set key=value`` as a TOML value (``2``, ``true``, ``"x"``,
    ``[1, 2]``); anything that is not a TOML literal is taken as a plain string, which the
    schema then types (``--set cluster.gpu=h200`` works without quotes).

    Raises:
        ValueError: the value nests arrays or inline tables more than :data:`MAX_DEPTH` deep, or
            holds an integer longer than Python reads (4300 digits).
    """
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise TooDeep(nesting_message()) from None
    except ValueError:  # int() refuses more than sys.get_int_max_str_digits() digits
        raise TooLong(LONG_NUMBER) from None
    if too_deep(value) is not None:
        raise TooDeep(nesting_message())
    return value


def too_deep(data: Any, limit: int = MAX_DEPTH) -> tuple[Any, ...] | None:
    """The path (keys and list indices) to the first dict or list in ``data`` nested more than
    ``limit`` levels deep, ``data`` itself being level 1; None when none is. Iterative, so it
    also ends on the deepest input and on self-containing (cyclic) Python values."""
    if not isinstance(data, (dict, list, tuple)):
        return None
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(data, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > limit:
            return path
        items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        for key, value in reversed(items):
            if isinstance(value, (dict, list, tuple)):
                stack.append((value, depth + 1, (*path, key)))
    return None


LONG_NUMBER = ("an integer with more digits than Python reads (4300): no spec value needs more than 19, "
               "the digits of int64")
