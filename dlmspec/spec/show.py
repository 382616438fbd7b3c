"""The spec ``dlmspec show`` prints with every default filled in, loaded back: the defaults it
wrote (:data:`SHOW_HEADER` marks the file) are left out again, so the file means what the spec meant
(:func:`without_defaults` also serves ``dlmspec new``'s minimal spec).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from dlmspec.spec.dotted import flatten_keys
from dlmspec.spec.schema_errors import _model_at

#: The first line of ``dlmspec show SPEC``'s TOML: with a lock's ``[lock] content_hash``, what
#: tells the loader that dlmspec wrote every default of the file itself.
SHOW_HEADER = "# Resolved spec printed by `dlmspec show`"


def _written_by_dlmspec(path: Path, data: dict[str, Any]) -> bool:
    """Whether the TOML spec ``path`` is a ``spec.lock.toml`` (its ``[lock]`` has a
    ``content_hash``) or ``dlmspec show`` output (its first line is :data:`SHOW_HEADER`)."""
    lock = data.get("lock")
    if isinstance(lock, dict) and isinstance(lock.get("content_hash"), str):
        return True
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.readline(len(SHOW_HEADER) + 1).startswith(SHOW_HEADER)
    except OSError:
        return False


#: What the layer above the spec gives the loader to tell whether leaving a written default out
#: changes the run (set by :func:`use_locked_form`; :mod:`dlmspec.resolve` sets it when imported).
_LOCKED_FORM: tuple[Callable[[dict[str, Any]], str], tuple[str, ...]] | None = None


def use_locked_form(canonical: Callable[[dict[str, Any]], str], filled_keys: tuple[str, ...]) -> None:
    """Give the loader the content-hash check of :func:`_without_written_defaults`.

    Args:
        canonical: spec data (a dict as loaded from TOML) -> a string equal for two data exactly
            when they compile to the same content hash (:mod:`dlmspec.resolve` gives the
            canonical JSON of its ``locked_spec(resolve(Spec(data)))``, which
            :func:`dlmspec.render.compile.content_hash` hashes). May raise for data that does
            not validate.
        filled_keys: dotted keys a ``spec.lock.toml`` fills in from resolving the spec
            (:data:`dlmspec.resolve.LOCK_FILLED_KEYS`).

    The spec layer sits below the resolver, so the resolver hands the check down (it calls
    this when imported); until then a lock or ``show`` file loads with every key it wrote set.
    """
    global _LOCKED_FORM
    _LOCKED_FORM = (canonical, tuple(filled_keys))


def _without_written_defaults(data: dict[str, Any],
                              locked_form: tuple[Callable[[dict[str, Any]], str], tuple[str, ...]] | None = None,
                              ) -> dict[str, Any]:
    """A lock's or ``show``'s data without the keys dlmspec wrote for the defaults: each key
    whose value is its default (the preset's, under ``[model]``), and each value the lock
    filled in from resolving the spec (the ``filled_keys`` of :func:`use_locked_form`) when
    resolving without it gives it back. They are then unset, as in the spec the file was written from, so rules about keys
    "given" (the "has no effect" warnings, ``train-budget``) do not fire on them. The result
    is the same run: when its canonical form (``locked_form``, else the one given to
    :func:`use_locked_form`) differs from ``data``'s (or anything fails), ``data`` is returned
    as it is; so it is when no check was given.
    """
    form = locked_form or _LOCKED_FORM
    if form is None:
        return data
    locked, filled_keys = form
    try:
        target = locked(data)
        trimmed = without_defaults(data)
        for key in filled_keys:
            *table, leaf = key.split(".")
            node = trimmed
            for part in table:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and leaf in node:
                value = node.pop(leaf)
                if locked(trimmed) != target:
                    node[leaf] = value
        return trimmed if locked(trimmed) == target else data
    except Exception:  # noqa: BLE001 - a spec that does not validate: validation reports it as written
        return data


def without_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of the spec data ``data`` without the keys whose value is their default (under
    ``[model]`` with a ``preset``, the preset's value), tables left empty dropped; ``name``,
    required keys and ``[lock]`` are kept. Loads to the same values (imports the models)."""
    import copy

    from dlmspec.spec.presets import PRESETS

    trimmed = copy.deepcopy(data)
    preset = PRESETS.get((trimmed.get("model") or {}).get("preset") or "", {})
    for key in reversed(flatten_keys(trimmed)):  # leaves before their tables
        *table, leaf = key.split(".")
        if not table or table[0] == "lock":
            continue
        model = _model_at(table)
        info = model.model_fields.get(leaf) if model is not None else None
        in_preset = table == ["model"] and leaf in preset
        if info is None or (info.is_required() and not in_preset):
            continue
        default = preset[leaf] if in_preset else info.get_default(call_default_factory=True)
        node: Any = trimmed
        for part in table:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node and node[leaf] == default:
            del node[leaf]
    for key in [k for k, v in trimmed.items() if v == {} and k not in ("model", "train")]:
        del trimmed[key]
    return trimmed
