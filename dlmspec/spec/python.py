"""The Python DSL: what a ``.py`` spec writes, and where each of its values was set.

A Python spec builds :class:`~dlmspec.spec.models.Spec` objects (``Spec(...)``,
``Spec.from_preset(...)``, ``Spec.load(...)``, ``.replace(...)``, attribute assignment, which
pydantic validates) and assigns ``spec``: one spec, or a sweep (a list, a dict of name -> spec,
or a generator). ``docs/python.md`` is the user's guide.

While :mod:`dlmspec.spec.load` runs a spec file (:func:`recording`), every construction,
``replace`` and assignment records, from the call stack, the file and line of each keyword
(:func:`call_origins` reads the caller's call expression with :mod:`ast`), so issues point at the
line that set the value, as they do for TOML. Outside the loader nothing is recorded. Each
``Spec`` also keeps the ``{name}`` templates of its run paths (:data:`dlmspec.spec.names.NAME_KEYS`),
so a member renamed by ``replace(name=...)`` gets folders of its own.

Imports neither pydantic nor the models at import time (the models import this module).
"""

from __future__ import annotations

import ast
import functools
import itertools
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from dlmspec.spec.names import NAME_KEYS, has_placeholder

#: ``(file, line)`` where a value was set (the loader's ``Origin``).
Origin = tuple[str, int | None]

#: Folders whose frames are dlmspec's or pydantic's own, never the user's.
_INTERNAL = (str(Path(__file__).resolve().parent.parent) + "/", )
_PYDANTIC_PARTS = ("pydantic", "pydantic_core")

_counter = itertools.count()
_recording = 0


@dataclass
class Record:
    """What dlmspec knows about one spec object (a :class:`~dlmspec.spec.models.Spec` or a
    table): ``origins`` (dotted key relative to the object -> (order, origin); a later order
    wins) and, for a ``Spec``, ``templates`` (NAME_KEYS key -> the value with ``{name}``)."""

    origins: dict[str, tuple[int, Origin]] = field(default_factory=dict)
    templates: dict[str, str] = field(default_factory=dict)


_records: dict[int, tuple[weakref.ref, Record]] = {}


def record_of(obj: Any, create: bool = False) -> Record | None:
    """The :class:`Record` of ``obj`` (``create``: a new empty one when it has none)."""
    entry = _records.get(id(obj))
    if entry is not None and entry[0]() is obj:
        return entry[1]
    if not create:
        return None
    record = Record()
    key = id(obj)
    _records[key] = (weakref.ref(obj, lambda _ref, key=key: _records.pop(key, None)), record)
    return record


class recording:
    """``with recording():`` records origins while a spec file runs (nests; not thread-safe,
    like the loader)."""

    def __enter__(self) -> "recording":
        global _recording
        _recording += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        global _recording
        _recording -= 1


def is_recording() -> bool:
    """Whether :func:`recording` is active."""
    return _recording > 0


# --------------------------------------------------------------------------- the call stack


@functools.lru_cache(maxsize=4096)
def _internal(filename: str) -> bool:
    """Whether frames of ``filename`` are dlmspec's, pydantic's or synthetic (cached: a sweep
    asks once per construction, about the same few files)."""
    if filename.startswith("<"):
        return True  # runpy's frozen frames, exec'd strings
    if filename.startswith(_INTERNAL) and "/dlmspec/specs/" not in filename:
        return True
    parts = Path(filename).parts
    return any(p in _PYDANTIC_PARTS for p in parts)


def user_frame(depth: int = 2) -> Any:
    """The innermost frame of the call stack that is neither dlmspec's nor pydantic's (the
    user's spec file, or a module of theirs), or None."""
    frame = sys._getframe(depth)
    while frame is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


_trees: dict[tuple[str, int], ast.AST | None] = {}


def _tree(filename: str) -> ast.AST | None:
    """The parsed source of ``filename`` (cached by file and modification time)."""
    try:
        mtime = Path(filename).stat().st_mtime_ns
    except OSError:
        return None
    key = (filename, mtime)
    if key not in _trees:
        try:
            _trees[key] = ast.parse(Path(filename).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            _trees[key] = None
    return _trees[key]


def _position(frame: Any, lasti: int | None = None) -> tuple[int, int, int, int] | None:
    """``(line, end_line, col, end_col)`` of the instruction ``frame`` runs (or ``lasti``)."""
    index = (frame.f_lasti if lasti is None else lasti) // 2
    positions = list(frame.f_code.co_positions())
    if 0 <= index < len(positions) and None not in positions[index]:
        return positions[index]  # type: ignore[return-value]
    return None


_calls: dict[int, dict[tuple[int, int | None, int, int | None], ast.Call]] = {}


def _call_at(filename: str, position: tuple[int, int, int, int]) -> ast.Call | None:
    """The call expression of ``filename`` at ``position`` (``(line, end_line, col, end_col)``);
    the file's calls are indexed once per parsed tree, so a sweep of N members built by one
    line costs N look-ups, not N walks of the file."""
    tree = _tree(filename)
    if tree is None:
        return None
    index = _calls.get(id(tree))
    if index is None:
        index = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                index.setdefault((node.lineno, node.end_lineno, node.col_offset, node.end_col_offset), node)
        _calls[id(tree)] = index
    return index.get(tuple(position))  # type: ignore[arg-type]


def _keys(node: ast.AST, prefix: str, out: dict[str, int]) -> None:
    """Dotted keys written in ``node`` (a call's keywords, a dict literal) -> their lines."""
    if isinstance(node, ast.Call):
        for kw in node.keywords:
            if kw.arg is None:  # **{...}
                _keys(kw.value, prefix, out)
            else:
                out[prefix + kw.arg] = kw.lineno
                _keys(kw.value, prefix + kw.arg + ".", out)
        for arg in node.args:
            if isinstance(arg, ast.Dict):
                _keys(arg, prefix, out)
    elif isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values):
            if key is None:
                _keys(value, prefix, out)
            elif isinstance(key, ast.Constant) and isinstance(key.value, str):
                out[prefix + key.value] = key.lineno
                _keys(value, prefix + key.value + ".", out)


def call_origins(frame: Any, lasti: int | None = None) -> tuple[dict[str, Origin], Origin | None]:
    """The keys written in the call expression ``frame`` is running (keywords, ``**{...}`` and
    dict literals, nested; dotted string keys as written) -> ``(file, line)``, and the origin of
    the call itself (its first line). Keys passed through variables are not seen (the call's
    line stands for them)."""
    filename = frame.f_code.co_filename
    position = _position(frame, lasti)
    line = position[0] if position else frame.f_lineno
    here: Origin = (filename, line)
    call = _call_at(filename, position) if position else None
    if call is None:
        return {}, here
    lines: dict[str, int] = {}
    _keys(call, "", lines)
    return {key: (filename, number) for key, number in lines.items()}, here


# --------------------------------------------------------------------------- hooks (models.py)


def note_init(obj: Any, data: dict[str, Any]) -> None:
    """``Section.__init__``'s hook: record the keywords' lines (while recording) and, for a
    ``Spec``, the ``{name}`` templates of ``data``."""
    if type(obj).__name__ == "Spec":
        templates = templates_in(data)
        if templates:
            record_of(obj, create=True).templates.update(templates)
    if not is_recording():
        return
    frame = user_frame(3)
    if frame is None:
        return
    origins, here = call_origins(frame)
    record = record_of(obj, create=True)
    for key in data:
        origins.setdefault(key, here)  # type: ignore[arg-type]
    _note(record, origins)


def note_assign(obj: Any, name: str) -> None:
    """``Section.__setattr__``'s hook: ``obj.name = ...`` was set on the user's current line."""
    if not is_recording():
        return
    frame = user_frame(3)
    if frame is None:
        return
    record = record_of(obj, create=True)
    _note(record, {name: (frame.f_code.co_filename, frame.f_lineno)})
    for key in [k for k in record.origins if k.startswith(name + ".")]:
        del record.origins[key]  # a new table replaces what was recorded under it


def note_replace(old: Any, new: Any, changes: dict[str, Any]) -> None:
    """``Spec.replace``'s hook: ``new`` inherits ``old``'s origins, then the call's keywords."""
    inherited = collect(old, ordered=True)
    record = record_of(new, create=True)
    record.origins.update(inherited)
    if not is_recording():
        return
    frame = user_frame(3)
    if frame is None:
        return
    origins, here = call_origins(frame)
    for key in changes:
        origins.setdefault(key, here)  # type: ignore[arg-type]
    _note(record, origins)


def _note(record: Record, origins: dict[str, Origin]) -> None:
    order = next(_counter)
    for key, origin in origins.items():
        record.origins[key] = (order, origin)


def collect(spec: Any, *, ordered: bool = False) -> dict[str, Any]:
    """Every recorded origin of ``spec`` and its tables, by dotted key (the latest wins);
    ``ordered``: values are ``(order, origin)``."""
    found: dict[str, tuple[int, Origin]] = {}

    def walk(obj: Any, prefix: str) -> None:
        record = record_of(obj)
        if record is not None:
            for key, (order, origin) in record.origins.items():
                full = prefix + key
                if full not in found or found[full][0] < order:
                    found[full] = (order, origin)
        for name in type(obj).model_fields:
            value = obj.__dict__.get(name)
            if hasattr(value, "model_fields_set"):
                walk(value, f"{prefix}{name}.")

    walk(spec, "")
    return found if ordered else {k: v for k, (_, v) in found.items()}


def templates_in(data: Any) -> dict[str, str]:
    """The values of :data:`NAME_KEYS` in ``data`` (dicts or tables) that hold ``{name}``."""
    out = {}
    for key in NAME_KEYS:
        node = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else getattr(node, part, None) \
                if hasattr(node, "model_fields_set") else None
        if isinstance(node, str) and has_placeholder(node):
            out[key] = node
    return out


def templates_of(spec: Any) -> dict[str, str]:
    """The ``{name}`` templates ``spec`` was built with (empty when none)."""
    record = record_of(spec)
    return dict(record.templates) if record else {}


# --------------------------------------------------------------------------- what a spec file gives


def spec_data(spec: Any) -> dict[str, Any]:
    """A ``Spec`` object as the data a TOML file would hold: only the keys that were set
    (defaults stay defaults, so rules about keys "given" see what the user gave), ``None`` left
    out, and the run paths as their ``{name}`` templates."""
    from dlmspec.spec.dotted import set_dotted

    data = spec.model_dump(exclude_unset=True, exclude_none=True)
    _add_assigned_tables(spec, data)
    for key, template in templates_of(spec).items():
        set_dotted(data, key, template)
    return data


def _add_assigned_tables(model: Any, data: dict[str, Any]) -> None:
    """Add to ``data`` the tables of ``model`` whose keys were assigned although the table
    itself never was (``spec.parallel.tensor_model_parallel_size = 2`` on a spec whose file has no
    ``[parallel]``): pydantic's ``exclude_unset`` leaves such a table out, since the parent's
    ``model_fields_set`` does not hold it, and the assignment was lost."""
    from pydantic import BaseModel

    for name in type(model).model_fields:
        value = getattr(model, name, None)
        if not isinstance(value, BaseModel):
            continue
        if name not in data:
            sub = value.model_dump(exclude_unset=True, exclude_none=True)
            _add_assigned_tables(value, sub)
            if sub:
                data[name] = sub
        elif isinstance(data[name], dict):
            _add_assigned_tables(value, data[name])


def error_frames(tb: Any) -> Iterator[Any]:
    """The traceback entries of ``tb`` in user code (see :func:`user_frame`), outermost first."""
    while tb is not None:
        if not _internal(tb.tb_frame.f_code.co_filename):
            yield tb
        tb = tb.tb_next

