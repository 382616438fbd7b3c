"""Loading specs: TOML files, Python files, ``extends`` and ``--set`` overrides.

The result is a :class:`LoadedSpec`: the validated :class:`~dlmspec.spec.models.Spec` plus where
each key came from (file and line), so every later error can point at the line to edit.
Every problem found while loading is raised as one :class:`~dlmspec.errors.SpecError`.

Order of precedence, lowest first: the ``extends`` parent chain, the file itself, then each
``--set section.key=value`` in the order given.

Limits (each refused with one issue, never a hang, a RecursionError or unbounded memory): spec
files are read only when they are regular files (never pipes or devices, which can block or
never end) of at most :data:`MAX_SPEC_BYTES`; tables and arrays nest at most :data:`MAX_DEPTH`
levels (in files, Python specs and ``--set``); an ``extends`` chain has at most
:data:`MAX_EXTENDS` files; integers fit in int64 (:data:`INT64_MAX`), what megatron-core,
torch and numpy hold counts, sizes, ids and seeds in (larger ones made :mod:`dlmspec.resolve`
and the planner raise OverflowError).

pydantic and the spec models (:mod:`dlmspec.spec.models`) are imported only to validate: with
``load(..., fast=True)`` (``dlmspec validate`` and ``plan``) a plainly valid spec is checked by
:mod:`dlmspec.spec.fast` without them.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import json
import math
import os
import re
import stat
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from dlmspec.errors import Fix, SpecError, SpecIssue, printable_int, safe_repr
from dlmspec.spec.dotted import (LONG_NUMBER, MAX_DEPTH, SetValueError, TooDeep, deep_merge, flatten_keys, nesting_message,
                                  parse_set_value, set_dotted, too_deep)

if TYPE_CHECKING:
    from pydantic import BaseModel

    from dlmspec.spec.models import Spec

#: Where a key was written: ``(file, line)``; line is None for keys from a Python spec.
Origin = tuple[str, int | None]

#: Largest spec file read, bytes (4 MiB). Real specs are a few KiB; without a cap a mistaken
#: path (``extends = "/dev/zero"``, a dataset) filled memory.
MAX_SPEC_BYTES = 4 << 20

#: Most files in an ``extends`` chain, the spec itself included (real chains have 2 or 3; a
#: chain of about 1000 raised RecursionError).
MAX_EXTENDS = 32

#: Largest integer a spec holds (int64); the smallest is ``-INT64_MAX - 1``.
INT64_MAX = 2**63 - 1

#: The fix of a nesting issue.
_SPEC_DEPTH_HINT = ("write it flatter, as the spec's keys (the deepest is cluster.slurm.env.NAME); "
                    "`dlmspec schema` lists them")


@dataclass
class LoadedSpec:
    """A validated spec and where its keys came from.

    Attributes:
        spec: the validated spec (schema-valid; cross-field rules are checked by
            :mod:`dlmspec.check`).
        path: the file it was loaded from.
        origins: dotted key -> (file, line) of the value that won.
        raw: the merged dict before validation (what the user wrote, after extends and --set;
            ``{name}`` not expanded).
        files: each file of the ``extends`` chain, the spec itself first, as ``origins`` spells
            it -> the ``name`` of the spec that file defines (written there, else inherited from
            its parents, else the default); ``--set`` is not among them. Rules tell by it
            which keys a parent wrote, and for which run.
    """

    spec: Spec
    path: Path
    origins: dict[str, Origin] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    def locate(self, key: str) -> Origin:
        """(file, line) for ``key``: :func:`locate_key`."""
        return locate_key(self.origins, key, self.path)


#: Where issues of command-line flags (``--set``) are reported.
COMMAND_LINE = "command line"

def locate_key(origins: dict[str, Origin], key: str, path: Path) -> Origin:
    """(file, line) for dotted ``key`` in ``origins``, else its nearest written ancestor (a table
    header), else the first key written under it (a misspelt table given only by
    ``--set t.k=v``), else ``(path, None)``."""
    parts = key.split(".")
    while parts:
        origin = origins.get(".".join(parts))
        if origin:
            return origin
        parts.pop()
    prefix = key + "."
    for written, origin in origins.items():
        if written.startswith(prefix):
            return origin
    return (str(path), None)


_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-.\"']+)\s*=")


def line_map(text: str) -> dict[str, int]:
    """Map each dotted key and table of a TOML document to its 1-based line.

    A small scanner, not a TOML parser: it reads table headers (``[a.b]``, ``[[a]]``) and
    ``key =`` lines at the start of a line, which is where a key's value begins; keys inside
    multi-line arrays or inline tables map to the line of their enclosing key.
    """
    lines: dict[str, int] = {}
    table = ""
    depth = 0  # open brackets of a multi-line value
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.split("#", 1)[0] if '"' not in raw and "'" not in raw else raw
        if depth == 0:
            header = _HEADER.match(raw)
            if header and not _KEY.match(raw):
                table = header.group(1).replace('"', "").replace("'", "").replace(" ", "")
                lines.setdefault(table, number)
                continue
            key = _KEY.match(raw)
            if key:
                name = key.group(1).replace('"', "").replace("'", "")
                dotted = f"{table}.{name}" if table else name
                lines.setdefault(dotted, number)
        depth += stripped.count("[") + stripped.count("{") - stripped.count("]") - stripped.count("}")
        depth = max(depth, 0)
    return lines


_INT64_HINT = f"use a value that fits in int64 (-{INT64_MAX + 1} .. {INT64_MAX})"


def _int64_issues(data: Any, origins: dict[str, Origin], path: Path) -> list[SpecIssue]:
    """An issue per integer of ``data`` outside int64 (iterative; ``data`` is at most
    :data:`MAX_DEPTH` deep by now)."""
    issues = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            stack.extend((v, (*where, k)) for k, v in reversed(list(node.items())))
        elif isinstance(node, (list, tuple)):
            stack.extend((v, (*where, i)) for i, v in reversed(list(enumerate(node))))
        elif isinstance(node, int) and not isinstance(node, bool) and not -INT64_MAX - 1 <= node <= INT64_MAX:
            key = ".".join(_leading_keys(where)) or "<root>"
            sign = "-" if node < 0 else ""
            if printable_int(node):
                digits = str(abs(node))
                shown: Any = node if len(digits) <= 30 else f"{sign}{digits[:12]}... ({len(digits)} digits)"
            else:  # str() refuses more than sys.get_int_max_str_digits() digits
                shown = sign + safe_repr(abs(node))
            file, line = locate_key(origins, key, path)
            example = _default_example(key)
            fix = Fix({key: int(example.rpartition(" = ")[2])}) if example else None
            issues.append(SpecIssue(key, f"does not fit in int64 (-{INT64_MAX + 1} .. {INT64_MAX}), the integer type "
                                    "megatron-core, torch and numpy hold counts, sizes, ids and seeds in",
                                    value=shown, hint=_INT64_HINT + (f", e.g. {example}" if example else ""),
                                    rule="int64", file=file, line=line, fix=fix))
    return issues


def _placeholder_issues(data: dict[str, Any], origins: dict[str, Origin], path: Path) -> list[SpecIssue]:
    """An issue per key of :data:`dlmspec.spec.names.NAME_KEYS` holding a brace other than
    ``{name}`` or a doubled one (the ``name-placeholder`` rule), at the file and line that wrote it."""
    from dlmspec.spec.names import placeholder_problems

    return [_placeholder_issue(key, value, origins, path) for key, value, _ in placeholder_problems(data)]


def _placeholder_issue(key: str, value: str, origins: dict[str, Origin], path: Path) -> SpecIssue:
    from dlmspec.spec.names import problem_hint, problem_message, suggest

    file, line = locate_key(origins, key, path)
    return SpecIssue(key, problem_message(value), value=value, hint=problem_hint(key, value),
                     rule="name-placeholder", file=file, line=line, fix=Fix({key: suggest(value)}))


def _default_example(key: str) -> str | None:
    """``leaf = default`` for the spec key ``key`` when its default is an integer (imports the
    spec models: error reports only)."""
    *table, leaf = key.split(".")
    model = _model_at(table)
    field = model.model_fields.get(leaf) if model is not None else None
    default = getattr(field, "default", None)
    if isinstance(default, int) and not isinstance(default, bool):
        return f"{leaf} = {default}"
    return None


def _short_key(path: tuple[Any, ...] | list[Any]) -> str:
    """The dotted key of ``path`` (up to its first list index), cut after 4 parts: what a
    nesting issue names."""
    parts = _leading_keys(tuple(path))
    if len(parts) > 4:
        return ".".join(parts[:4]) + "..."
    return ".".join(parts) or "<root>"


def _excerpt(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width] + "..."


def _short_repr(value: Any) -> str:
    """A bounded ``repr`` of a (possibly deep or cyclic) value."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 3, 40, 40
    return _excerpt(short.repr(value))


# --- reading files


def _file_kind(mode: int) -> str:
    """What a file that is not regular is, for messages (``stat`` mode)."""
    for test, kind in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a plain file"


@dataclass(frozen=True)
class _Ref:
    """Who named a spec file: the ``extends`` key (as written) at ``file``:``line``."""

    file: str
    line: int | None
    written: str


def _file_error(path: Path, message: str, hint: str, ref: _Ref | None) -> SpecError:
    """A :class:`SpecError` about the spec file ``path``, pointing at the ``extends`` that
    named it (``ref``) or, for the file given on the command line, at the file itself."""
    if ref is not None:
        return SpecError([SpecIssue("extends", message, value=ref.written, hint=hint, rule="file", file=ref.file,
                                    line=ref.line)])
    return SpecError([SpecIssue("<file>", message, value=str(path), hint=hint, rule="file", file=str(path))])


def _missing_file_hint(path: Path) -> str:
    """The fix for a spec file given on the command line that does not exist: a close name in its
    directory (``did you mean ...``) or the directory's absence, where a relative path is read
    from, and how to write a spec there (``dlmspec new``)."""
    import difflib  # only for this message

    cwd = Path.cwd()
    try:
        shown = path.relative_to(cwd) if path.is_absolute() else path
    except ValueError:
        shown = path
    read_from = f" (relative paths are read from {cwd})" if not shown.is_absolute() else ""
    folder = shown.parent
    try:
        specs = {p.stem: p.name for p in path.parent.iterdir() if p.suffix in (".toml", ".py") and p.is_file()}
    except OSError:
        specs = None
    if specs is None:
        first = f"the directory {folder} does not exist{read_from}"
    else:
        close = difflib.get_close_matches(path.stem, sorted(specs), n=1, cutoff=0.75)
        first = (f"did you mean {folder / specs[close[0]] if str(folder) != '.' else specs[close[0]]}?" if close
                 else f"check the path{read_from}")
    return f"{first}{' ' if first.endswith('?') else '. '}Or write a spec there: dlmspec new {shown} --from demo-dlm " \
           "(or --preset NAME)"


def _check_file(path: Path, ref: _Ref | None) -> int:
    """Check with ``os.stat`` (nothing is opened) that ``path`` is a regular file of at most
    :data:`MAX_SPEC_BYTES`; return its size.

    Raises:
        SpecError: missing, a directory, a pipe, device or socket, too large, or unreadable.
    """
    what = "a spec file (extends is relative to the file that names it)" if ref else "a .toml or .py spec file"
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise _file_error(path, f"file not found: {path}",
                          "check the path (extends is relative to the file that names it)" if ref else
                          _missing_file_hint(path), ref) from None
    except (OSError, ValueError) as exc:  # permissions, symlink loops, names too long, NUL bytes
        raise _file_error(path, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                          f"give the path of {what}", ref) from None
    if stat.S_ISDIR(info.st_mode):
        raise _file_error(path, f"{path} is a directory, not a spec file", "give a .toml or .py spec file", ref)
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(path, info.st_mode, ref)
    if info.st_size > MAX_SPEC_BYTES:
        raise _too_large(path, info.st_size, ref)
    return info.st_size


def _not_regular(path: Path, mode: int, ref: _Ref | None) -> SpecError:
    return _file_error(path, f"{path} is {_file_kind(mode)}, not a regular file: dlmspec reads specs only from "
                       "regular files (a pipe or device can block or never end)",
                       "give the path of a spec file; to use generated text, write it to a file first", ref)


def _too_large(path: Path, size: int | None, ref: _Ref | None) -> SpecError:
    size_text = f"{size:,} bytes" if size is not None else "more than that"
    return _file_error(path, f"{path} is {size_text}: dlmspec reads at most {MAX_SPEC_BYTES >> 20} MiB "
                       f"({MAX_SPEC_BYTES:,} bytes) of a spec file, and a spec is a few KiB",
                       "check that this is the spec you meant" + (" (extends names a spec file)" if ref else ""),
                       ref)


def _read_spec_text(path: Path, ref: _Ref | None) -> str:
    """The text of the TOML spec ``path``, read as :func:`_check_file` allows: opened without
    blocking, checked again on the open file (a pipe put there after the check is not read),
    and read up to :data:`MAX_SPEC_BYTES` (one byte more tells that it grew). Newlines are
    read as ``Path.read_text`` reads them.

    Raises:
        SpecError: see :func:`_check_file`; not UTF-8.
    """
    _check_file(path, ref)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as exc:
        raise _file_error(path, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                          "check the path and its permissions", ref) from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode, ref)
        try:
            data = handle.read(MAX_SPEC_BYTES + 1)
        except OSError as exc:
            raise _file_error(path, f"cannot read {path}: {exc.strerror or exc}", "check the file", ref) from None
    if len(data) > MAX_SPEC_BYTES:
        raise _too_large(path, None, ref)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([SpecIssue("<file>", f"not UTF-8 text (byte {exc.start}): a spec is a TOML or Python file",
                                   value=str(path), hint="save the spec as UTF-8 text", rule="file",
                                   file=str(path))]) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _deep_line(text: str) -> int | None:
    """1-based line where the brackets of ``text`` first open more than :data:`MAX_DEPTH` deep
    (counted naively, strings included): where to point when the TOML parser ran out of
    recursion."""
    depth = 0
    for number, line in enumerate(text.splitlines(), start=1):
        for char in line:
            if char in "[{":
                depth += 1
                if depth > MAX_DEPTH:
                    return number
            elif char in "]}":
                depth = max(0, depth - 1)
    return None


def _nesting_error(path: Path, text: str, lines: dict[str, int], key_path: tuple[Any, ...] | None,
                   line: int | None) -> SpecError:
    """The nesting issue of the TOML file ``path``: at ``key_path`` (from :func:`too_deep`),
    else at ``line``, naming the key written on or above that line."""
    if key_path is not None:
        full = ".".join(_leading_keys(key_path))
        origins: dict[str, Origin] = {k: (str(path), n) for k, n in lines.items()}
        line = locate_key(origins, full, path)[1]
        key = _short_key(key_path)
    else:
        above = [(n, k) for k, n in lines.items() if line is not None and n <= line]
        key = _short_key(max(above)[1].split(".")) if above else "<toml>"
    source = text.splitlines()[line - 1].strip() if line else ""
    return SpecError([SpecIssue(key, nesting_message(), value=_excerpt(source) or None, hint=_SPEC_DEPTH_HINT,
                                rule="nesting", file=str(path), line=line)])


def _long_number_error(path: Path, text: str) -> SpecError:
    """The issue of a TOML file holding an integer longer than Python reads, at its line."""
    match = re.search(r"[0-9_]{4301,}", text)
    line = text.count("\n", 0, match.start()) + 1 if match else None
    above = [(n, k) for k, n in line_map(text).items() if line is not None and n <= line]
    key = max(above)[1] if above else "<toml>"
    source = text.splitlines()[line - 1].strip() if line else ""
    return SpecError([SpecIssue(key, LONG_NUMBER, value=_excerpt(source) or None, hint=_INT64_HINT, rule="int64",
                                file=str(path), line=line)])


def _leading_keys(path: tuple[Any, ...]) -> list[str]:
    """The keys at the start of ``path``, up to its first list index."""
    keys = []
    for part in path:
        if not isinstance(part, str):
            break
        keys.append(part)
    return keys


def _load_toml(path: Path) -> tuple[dict[str, Any], dict[str, Origin], dict[str, str]]:
    """Read the TOML spec ``path`` and its ``extends`` chain (at most :data:`MAX_EXTENDS`
    files, no cycles) and merge them, parents first; also return where each key was written and
    :attr:`LoadedSpec.files`."""
    chain: list[tuple[dict[str, Any], dict[str, Origin]]] = []
    seen: list[Path] = []
    ref: _Ref | None = None
    while True:
        if path in seen:
            names = " -> ".join(str(p) for p in (*seen, path))
            assert ref is not None
            raise SpecError([SpecIssue("extends", f"circular extends: {names}", value=ref.written,
                                       hint="remove the extends that leads back: a spec cannot extend itself or a "
                                       "spec that extends it", rule="extends", file=ref.file, line=ref.line,
                                       fix=Fix(unset=("extends",)))])
        if len(seen) == MAX_EXTENDS:
            assert ref is not None
            shown = [p.name for p in seen]
            names = " -> ".join(shown if len(shown) <= 5 else [*shown[:3], "...", *shown[-2:]])
            raise SpecError([SpecIssue("extends", f"the extends chain is longer than {MAX_EXTENDS} files "
                                       f"({names} -> ...)", value=ref.written,
                                       hint=f"extend a spec nearer the base: a chain has at most {MAX_EXTENDS} "
                                       "files (a base and a few layers)", rule="extends", file=ref.file,
                                       line=ref.line)])
        data, origins, parent, lines = _read_toml(path, ref)
        chain.append((data, origins))
        seen.append(path)
        if parent is None:
            break
        if not isinstance(parent, str):
            raise SpecError([SpecIssue("extends", "extends must be a file path string", value=parent,
                                       hint='e.g. extends = "base.toml"', rule="extends", file=str(path),
                                       line=lines.get("extends"))])
        try:
            parent_path = (path.parent / parent).resolve()
        except (OSError, ValueError, RuntimeError) as exc:
            raise SpecError([SpecIssue("extends", f"not a usable path: {exc}", value=parent, rule="extends",
                                       hint="give the path of a spec file, relative to this one",
                                       file=str(path), line=lines.get("extends"))]) from None
        ref = _Ref(str(path), lines.get("extends"), parent)
        path = parent_path
    files = _chain_names([str(p) for p in seen], [d for d, _ in chain])
    data, origins = chain.pop()
    while chain:  # children over parents
        child, child_origins = chain.pop()
        child_origins.pop("extends", None)
        data, origins = deep_merge(data, child), {**origins, **child_origins}
    return data, origins, files


def _chain_names(files: list[str], tables: list[dict[str, Any]]) -> dict[str, str]:
    """:attr:`LoadedSpec.files` of an ``extends`` chain: ``files`` and their ``tables``, the
    spec itself first."""
    from dlmspec.spec.names import DEFAULT_NAME

    names: dict[str, str] = {}
    name = DEFAULT_NAME
    for file, table in zip(reversed(files), reversed(tables)):
        if isinstance(table.get("name"), str):
            name = table["name"]
        names[file] = name
    return dict(reversed(list(names.items())))


def _read_toml(path: Path, ref: _Ref | None) -> tuple[dict[str, Any], dict[str, Origin], Any, dict[str, int]]:
    """One TOML spec file: ``(data without extends, origins, the extends value or None, line map)``.

    Raises:
        SpecError: unreadable (:func:`_read_spec_text`), not TOML, nested too deep.
    """
    text = _read_spec_text(path, ref)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise SpecError(
            [SpecIssue("<toml>", f"not valid TOML: {exc}", rule="toml", file=str(path),
                       line=int(match.group(1)) if match else None,
                       hint="strings need quotes, tables are [section], keys are key = value")]
        ) from None
    except RecursionError:
        raise _nesting_error(path, text, line_map(text), None, _deep_line(text)) from None
    except ValueError:  # int() refuses more than sys.get_int_max_str_digits() digits
        raise _long_number_error(path, text) from None
    lines = line_map(text)
    deep = too_deep(data)
    if deep is not None:
        raise _nesting_error(path, text, lines, deep, None)
    origins: dict[str, Origin] = {k: (str(path), _line_of(lines, k)) for k in flatten_keys(data)}
    parent = data.pop("extends", None)
    return data, origins, parent, lines


def _line_of(lines: dict[str, int], key: str) -> int | None:
    """The line of ``key``, else of its nearest ancestor in ``lines`` (a key inside an inline
    table or an array: ``env = { NAME = ... }``)."""
    while key:
        if key in lines:
            return lines[key]
        key = key.rpartition(".")[0]
    return None


#: What a spec file name may end with to pick one member of a Python sweep: ``FILE.py::NAME``.
MEMBER_SEP = "::"


@dataclass
class _Member:
    """One spec of a Python spec file: its name, data (as a TOML file would hold it) and origins."""

    name: str
    data: dict[str, Any]
    origins: dict[str, Origin]


#: Python spec files already run in this process: (file, mtime_ns, size) -> members, or None for
#: a file that assigns one spec (its member is the only entry then).
_RUNS: dict[tuple[str, int, int], tuple[bool, list[_Member]]] = {}


def split_member(path: str | Path) -> tuple[Path, str | None]:
    """``FILE.py::NAME`` -> ``(FILE.py, NAME)``; any other path -> ``(path, None)``."""
    text = str(path)
    head, sep, member = text.rpartition(MEMBER_SEP)
    if sep and head.endswith(".py") and member:
        return Path(head), member
    return Path(path), None


def sweep_targets(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The spec targets of ``path``: ``[path]`` for a TOML file or a Python file that assigns
    one spec, else one ``FILE.py::NAME`` per member of the sweep it defines, in its order.
    ``overrides`` (``--set``, applied to every member by :func:`load`) are checked here too: one
    that gives the members one name or one checkpoint folder (``--set name=x``) is refused.

    Raises:
        SpecError: the Python file does not run or defines an unusable sweep (see :func:`load`),
            or ``overrides`` make it one (``sweep-names``, ``sweep-paths``; file ``--set``).
    """
    file, member = split_member(path)
    if member is not None or file.suffix != ".py":
        return [str(path)]
    try:
        absolute = file.resolve()
    except (OSError, ValueError, RuntimeError):
        return [str(path)]
    is_sweep, members = _run_python(absolute)
    if not is_sweep:
        return [str(path)]
    if overrides:
        _checked_sweep(absolute, [_overridden(m, overrides) for m in members])
    return [f"{path}{MEMBER_SEP}{m.name}" for m in members]


def _overridden(member: _Member, overrides: list[str] | tuple[str, ...]) -> _Member:
    """``member`` with the ``--set`` values of ``overrides`` that name or place it (``name``,
    ``checkpoint``), their origin ``--set``; a malformed one is skipped (:func:`load` reports it)."""
    import copy

    data, origins = copy.deepcopy(member.data), dict(member.origins)
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or key.split(".")[0] not in ("name", "checkpoint"):
            continue
        try:
            set_dotted(data, key, parse_set_value(text.strip()))
        except (ValueError, TypeError, AttributeError):
            continue
        origins[key] = ("--set", None)
    name = data.get("name", member.name)
    return _Member(name if isinstance(name, str) else str(name), data, origins)


def _run_python(path: Path) -> tuple[bool, list[_Member]]:
    """Run the Python spec ``path`` once per process and version of the file: ``(is_sweep,
    members)`` (:func:`_python_members`). The members are the cached ones, shared: a caller
    copies the one it changes (:func:`_load_python` copies one member per load, so loading each
    of N members costs N copies, not N x N)."""
    size = _check_file(path, None)
    key = (str(path), os.stat(path).st_mtime_ns, size)
    if key not in _RUNS:
        try:
            with _cpu_limit(MAX_PYTHON_CPU_S):
                _RUNS[key] = _python_members(path)
        except (SpecError, KeyboardInterrupt):
            raise
        except _TooLong as exc:
            raise _python_error(path, exc) from None
        except Exception as exc:  # noqa: BLE001 - the user's objects (a method of theirs raising) reach here
            raise _python_error(path, exc) from None
    return _RUNS[key]


#: CPU seconds a Python spec file may run: its own code, building the spec or the sweep's members.
MAX_PYTHON_CPU_S = 15.0


class _TooLong(BaseException):
    """Raised in a Python spec file's code when it ran past :data:`MAX_PYTHON_CPU_S` (a
    ``BaseException``, so the file's own ``except Exception`` does not swallow it)."""


@contextlib.contextmanager
def _cpu_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`_TooLong` in the running code once this process has used ``seconds`` more
    CPU time (``ITIMER_PROF``); only in the main thread of a platform with ``setitimer``, else no
    limit. The previous handler and timer are restored."""
    import signal
    import threading

    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise _TooLong()

    previous = signal.signal(signal.SIGPROF, expired)
    old_timer = signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, *old_timer)
        signal.signal(signal.SIGPROF, previous)


def _python_issue(path: Path, message: str, line: int | None, hint: str | None = None, value: Any = None,
                  key: str = "<python>") -> SpecIssue:
    return SpecIssue(key, message, value=value, hint=hint, rule="python", file=str(path), line=line)


def _python_error(path: Path, exc: BaseException) -> SpecError:
    """The issues of an exception a Python spec file raised: every schema error of a pydantic
    ValidationError at the line that set its key (the keyword in the call, the assignment),
    anything else as the user's own error at their line, with their frames (never dlmspec's)."""
    from pydantic import ValidationError

    from dlmspec.spec import python

    frames = list(python.error_frames(exc.__traceback__))
    last = frames[-1] if frames else None
    line = last.tb_lineno if last is not None else None
    if isinstance(exc, _TooLong):
        return SpecError([_python_issue(
            path, f"the spec file ran for more than {MAX_PYTHON_CPU_S:g} s of CPU time: a spec or sweep is built in "
            "well under that", line,
            hint="build fewer members, or move long computations out of the spec file")])
    file = last.tb_frame.f_code.co_filename if last is not None else str(path)
    if isinstance(exc, ValidationError):
        origins: dict[str, Origin] = {}
        prefix = _table_paths().get(exc.title, "")
        if last is not None:
            keys, here = python.call_origins(last.tb_frame, last.tb_lasti)
            origins = dict(keys)
        issues = []
        for err in exc.errors():
            err = dict(err)
            if prefix:
                err["loc"] = (*prefix.split("."), *err["loc"])
            issue = _schema_issue(err, origins, Path(file))
            if issue.line is None:
                issue.file, issue.line = file, line
            issues.append(issue)
        return SpecError(issues)
    import linecache

    where = [f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno} "
             f"{linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip()}" for tb in frames[-3:]]
    hint = ("your code raised it" + (f" (traceback, innermost last: {' | '.join(where)})" if where else "")
            + "; fix that line, then run dlmspec validate again")
    return SpecError([SpecIssue("<python>", f"the spec file raised {_type_name(exc)}: {_exc_text(exc)}", rule="python",
                                file=file, line=line, hint=hint)])


def _exc_text(exc: BaseException, limit: int = 500) -> str:
    """``str(exc)`` cut to ``limit`` characters; an exception whose ``__str__`` raises (or
    returns a non-string) is named by its type instead."""
    try:
        text = str(exc)
    except Exception:
        return f"<{_type_name(exc)} whose message cannot be printed>"
    if not isinstance(text, str):
        return f"<{_type_name(exc)}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _table_paths() -> dict[str, str]:
    """Each table class name of the spec -> its dotted path (``TrainSpec`` -> ``train``): where
    a table's ValidationError (``TrainSpec(...)``, an assignment) puts its keys."""
    from dlmspec.spec.models import Spec

    out: dict[str, str] = {"Spec": ""}

    def walk(model: Any, prefix: str) -> None:
        for name, info in model.model_fields.items():
            sub = _first_model(info.annotation)
            if sub is not None and sub.__name__ not in out:
                out[sub.__name__] = prefix + name
                walk(sub, prefix + name + ".")

    walk(Spec, "")
    return out


def _python_members(path: Path) -> tuple[bool, list[_Member]]:
    """Run a Python spec file and take its ``spec``: a Spec or a dict (one spec), or a sweep (a
    list or tuple, a dict of name -> Spec, or a generator of specs). The file must be a regular
    file of at most :data:`MAX_SPEC_BYTES` (:func:`_check_file`); what it runs is the user's code,
    not limited here. A ``spec`` dict nested more than :data:`MAX_DEPTH` deep (or containing
    itself) is refused; so are sweep members without a unique name or sharing a checkpoint folder.

    Returns:
        ``(is_sweep, members)``.

    Raises:
        SpecError: what the file raised (every schema error, at the lines that set the keys),
            ``sys.exit``, no or an unusable ``spec``, a bad sweep.
    """
    import types

    from pydantic import BaseModel

    from dlmspec.spec import python

    generated = False
    try:
        import runpy  # Python specs only

        with python.recording():
            namespace = runpy.run_path(str(path), run_name="__dlmspec__")
            value = namespace.get("spec")
            if isinstance(value, (types.GeneratorType, range, map, filter)) or (
                    not isinstance(value, (dict, list, tuple, str, bytes, BaseModel)) and hasattr(value, "__next__")):
                # a generator runs the user's code too; one that never ends would fill the memory
                value = list(itertools.islice(value, MAX_SWEEP_MEMBERS + 1))
                generated = True
    except SpecError:
        raise
    except SystemExit as exc:  # sys.exit() in a spec file must not decide dlmspec's exit code
        frames = list(python.error_frames(exc.__traceback__))
        raise SpecError([SpecIssue("<python>", f"the spec file called sys.exit({safe_repr(exc.code, 80)})", rule="python",
                                   hint="a spec file assigns `spec`; it does not exit", file=str(path),
                                   line=frames[-1].tb_lineno if frames else None)]) from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a user's file may raise anything; report it without a traceback
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):
            placeholders = [e for e in exc.errors() if e["type"] == "name_placeholder"]
            if placeholders:  # Spec(...) in the file refused a placeholder: the loader's own issue
                raise SpecError([_placeholder_issue(key, value, {}, path) for e in placeholders
                                 for key, value, _ in e["ctx"]["problems"]]) from None
        raise _python_error(path, exc) from None
    # subclasses of dict, list and tuple are read through their base type: none of the user's
    # methods (__len__, __iter__, items, ...) runs past this point
    if isinstance(value, dict) and type(value) is not dict:
        value = dict(dict.items(value))
    elif isinstance(value, (list, tuple)) and type(value) not in (list, tuple):
        value = list(list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value))
    size = len(value) if isinstance(value, (dict, list, tuple)) else 0
    if size > MAX_SWEEP_MEMBERS:
        raise SpecError([_python_issue(path, f"the sweep has more than {MAX_SWEEP_MEMBERS:,} members (a generator "
                                       f"is read up to {MAX_SWEEP_MEMBERS + 1:,}: one that never ends is cut there)",
                                       _spec_line(path), key="spec", value=f"{size:,} members" + (
                                           " read" if generated else ""),
                                       hint=f"give at most {MAX_SWEEP_MEMBERS:,} specs (split the sweep into files, "
                                       "or end the generator, e.g. with itertools.islice(gen, N))")])
    if isinstance(value, dict) and value and all(isinstance(v, BaseModel) for v in dict.values(value)):
        members = []
        for name, member in dict.items(value):
            if not isinstance(name, str) or not name:
                raise SpecError([_python_issue(path, "a sweep's names are non-empty strings", _spec_line(path),
                                               key="spec", value=safe_repr(name),
                                               hint='e.g. spec = {"mb2": base.replace(...)}')])
            name = str.__str__(name)
            if member.name != name:
                member = member.replace(name=name)
            members.append(_member(path, member))
        return True, _checked_sweep(path, members)
    if isinstance(value, (list, tuple)):
        if not value:
            raise SpecError([_python_issue(path, "the sweep is empty", _spec_line(path), key="spec", value="[]",
                                           hint="give at least one spec")])
        return True, _checked_sweep(path, [_member(path, m, i) for i, m in enumerate(value)])
    return False, [_member(path, value)]


def _member(path: Path, value: Any, index: int | None = None) -> _Member:
    """A spec of the file as data and origins (see :func:`_python_members`)."""
    from pydantic import BaseModel

    from dlmspec.spec import python
    from dlmspec.spec.names import DEFAULT_NAME

    where = "spec" if index is None else f"spec[{index}]"
    origins: dict[str, Origin] = {}
    if isinstance(value, BaseModel) and type(value).__name__ == "Spec":
        origins = python.collect(value)
        value = python.spec_data(value)
    if not isinstance(value, dict):
        raise SpecError([SpecIssue(where, "a Python spec must assign `spec = Spec(...)` (or a dict), or a "
                                   "sweep: a list, a dict of name -> Spec, or a generator of specs",
                                   value=_type_name(value) if value is not None else None,
                                   hint="end the file with: spec = Spec(model=..., train=...)",
                                   rule="python", file=str(path), line=_spec_line(path))])
    value = _plain_data(value, path, origins)
    if not origins:  # plain data: its keys were written where `spec` is assigned (or built above it)
        line = _spec_line(path)
        origins = {key: (str(path), line) for key in value} if line is not None else {}
    deep = too_deep(value)
    if deep is not None:
        node: Any = value
        for part in _leading_keys(deep)[:1]:
            node = node[part]
        raise SpecError([SpecIssue(_short_key(deep), nesting_message(), value=_short_repr(node),
                                   hint=_SPEC_DEPTH_HINT, rule="nesting", file=str(path))])
    name = value.get("name", DEFAULT_NAME)
    return _Member(name if isinstance(name, str) else str(name), value, origins)


#: Most members a Python sweep may have (a generator is read up to one more, so one that never
#: ends stops there instead of filling the memory).
MAX_SWEEP_MEMBERS = 10_000


def _type_name(value: Any) -> str:
    try:
        return str.__str__(type(value).__name__)
    except Exception:  # a metaclass may make even this raise
        return "object"


def _spec_line(path: Path) -> int | None:
    """The line of the file's last top-level ``spec = ...`` (where a spec built from plain data
    was assigned), or None."""
    from dlmspec.spec.python import _tree

    tree = _tree(str(path))
    line = None
    for node in getattr(tree, "body", []):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        if any(isinstance(t, ast.Name) and t.id == "spec" for t in targets):
            line = node.lineno
    return line


def _plain_data(data: dict[str, Any], path: Path, origins: dict[str, Origin]) -> dict[str, Any]:
    """A copy of the spec data ``data`` a Python file gave, made of what a TOML file holds:
    dicts with string keys, lists, strings, numbers, booleans, dates and times (subclasses read
    through their base type, so a subclass's ``items()``, ``__iter__``, ``__str__`` or
    ``__repr__`` never runs; a ``pathlib`` path becomes its string). Iterative, and deeper than
    :data:`MAX_DEPTH` (or cyclic) stops the copy; :func:`too_deep` then reports it.

    Raises:
        SpecError: a value of another type (a user's object, a set, bytes, ...), a key that is
            not a string, an integer longer than Python prints (4300 digits): each at its key, the
            line that set it when known (else the ``spec =`` line), with the value shown safely.
    """
    import datetime
    import pathlib

    issues: list[SpecIssue] = []

    def issue(where: tuple[Any, ...], message: str, value: str, hint: str, rule: str = "python") -> None:
        key = ".".join(str(p) for p in where) or "<spec>"
        file, line = locate_key(origins, key, path)
        issues.append(SpecIssue(key, message, value=value, hint=hint, rule=rule, file=file,
                                line=line or _spec_line(path)))

    out: Any = {}
    stack: list[tuple[Any, Any, Any, tuple[Any, ...], int]] = [(data, None, None, (), 1)]
    while stack:
        node, parent, slot, where, depth = stack.pop()
        if isinstance(node, bool) or node is None:
            copy: Any = node
        elif isinstance(node, str):
            copy = str.__str__(node)
        elif isinstance(node, int):
            copy = int.__int__(node)
            if not printable_int(copy):
                issue(where, LONG_NUMBER, safe_repr(copy), "write the number itself; counts and sizes fit in int64",
                      rule="int64")
        elif isinstance(node, float):
            copy = float.__float__(node)
        elif isinstance(node, (datetime.date, datetime.time)):
            copy = node
        elif isinstance(node, pathlib.PurePath):
            copy = os.fspath(node)
        elif isinstance(node, (dict, list, tuple)):
            if depth > MAX_DEPTH:  # too_deep reports it on what was copied (an empty table this deep)
                copy = {} if isinstance(node, dict) else []
            elif isinstance(node, dict):
                copy = {}
                for key, value in reversed(list(dict.items(node))):
                    if not isinstance(key, str):
                        issue(where, f"a key of this table is a {_type_name(key)} ({safe_repr(key, 60)}); spec keys "
                              "are names (strings)", safe_repr(key), "write the key as a string, or remove it",
                              rule="schema")
                        continue
                    key = str.__str__(key)
                    stack.append((value, copy, key, (*where, key), depth + 1))
            else:
                items = list(list.__iter__(node) if isinstance(node, list) else tuple.__iter__(node))
                copy = [None] * len(items)
                for index in reversed(range(len(items))):
                    stack.append((items[index], copy, index, (*where, index), depth + 1))
        else:
            issue(where, f"a spec value is a string, number, boolean, date, list or table (what TOML holds); this "
                  f"is a {_type_name(node)} object", safe_repr(node),
                  "write the value itself (str(...) for a path or a name, int(...) or float(...) for a number)")
            continue
        if parent is None:
            out = copy
        else:
            parent[slot] = copy
    if issues:
        raise SpecError(issues)
    return out


def _checked_sweep(path: Path, members: list[_Member]) -> list[_Member]:
    """``members``, after refusing two with one name or one checkpoint folder (once per key
    when a ``--set`` gave it: :func:`sweep_targets`)."""
    from dlmspec.spec.names import expand

    issues = []
    seen: dict[str, _Member] = {}
    saves: dict[str, str] = {}
    flagged: set[str] = set()
    for m in members:
        file, line = locate_key(m.origins, "name", path)
        if m.name in seen and file == "--set":
            if "name" not in flagged:
                flagged.add("name")
                issues.append(SpecIssue("name", "--set applies to every member of the sweep, so they would all be "
                                        f"named {m.name!r} and share its folders", value=m.name, rule="sweep-names",
                                        hint="leave name out of --set (each member is named in the file), or "
                                        f"pick one member: {path.name}{MEMBER_SEP}<name>", file=file, line=line))
            continue
        if m.name in seen:
            issues.append(SpecIssue("name", f"two members of the sweep are named {m.name!r}: each compiles into a "
                                    "folder of its name and runs under it", value=m.name, rule="sweep-names",
                                    hint="give each member its own name: member.replace(name=...) or a dict "
                                    "of name -> spec", file=file, line=line))
            continue
        seen[m.name] = m
        save = (m.data.get("checkpoint") or {}).get("save")
        if isinstance(save, str):
            try:
                folder = expand(save, m.name)
            except ValueError:
                continue
            if folder in saves:
                file, line = locate_key(m.origins, "checkpoint.save", path)
                if file == "--set":
                    if "checkpoint.save" not in flagged:
                        flagged.add("checkpoint.save")
                        issues.append(SpecIssue("checkpoint.save", "--set applies to every member of the sweep, so "
                                                f"they would share the checkpoint folder {folder!r}", value=save,
                                                rule="sweep-paths", file=file, line=line,
                                                hint='write it with {name}: --set "checkpoint.save=runs/{name}/'
                                                'checkpoints" (each member gets its own)'))
                    continue
                issues.append(SpecIssue("checkpoint.save", f"members {saves[folder]!r} and {m.name!r} of the sweep "
                                        f"share the checkpoint folder {folder!r}: one would resume the other's",
                                        value=save, rule="sweep-paths", file=file, line=line,
                                        hint='write checkpoint.save = "runs/{name}/checkpoints" so that each '
                                        "member gets its own", fix=Fix({"checkpoint.save": "runs/{name}/checkpoints"})))
            saves[folder] = m.name
    if issues:
        raise SpecError(issues)
    return members


def _non_string_keys(data: Any, path: Path, prefix: str = "") -> list[SpecIssue]:
    """Issues for table keys that are not strings (a Python spec's ``{1: 2}``; TOML keys are
    always strings): spec keys are names, and pydantic would raise a bare ``TypeError``."""
    issues: list[SpecIssue] = []
    if isinstance(data, dict):
        for key, value in data.items():
            if not isinstance(key, str):
                where = prefix.rstrip(".") or "<spec>"
                issues.append(SpecIssue(where, f"a key of this table is {key!r} ({type(key).__name__}); spec keys are "
                                        "names (strings)", value=repr(key)[:80],
                                        hint=f"write the key as a string, e.g. {str(key)!r}, or remove it",
                                        rule="schema", file=str(path)))
            else:
                issues.extend(_non_string_keys(value, path, f"{prefix}{key}."))
    return issues


#: id of a cached member list (:data:`_RUNS`, kept for the process) -> its members by name.
_BY_NAME: dict[int, dict[str, _Member]] = {}


def _by_name(members: list[_Member]) -> dict[str, _Member]:
    """``members`` by name (the first of a name), built once per cached list."""
    index = _BY_NAME.get(id(members))
    if index is None:
        index = {}
        for m in members:
            index.setdefault(m.name, m)
        _BY_NAME[id(members)] = index
    return index


def _some_names(members: list[_Member], shown: int = 10) -> str:
    """The first ``shown`` member names, comma-separated, and how many more there are."""
    names = ", ".join(m.name for m in members[:shown])
    return names + (f", ... ({len(members) - shown} more)" if len(members) > shown else "")


def _load_python(path: Path, member: str | None = None) -> tuple[dict[str, Any], dict[str, Origin]]:
    """The data and origins of the Python spec ``path`` (``member``: of that member of its
    sweep). Raises SpecError: see :func:`_python_members`; a sweep without ``member``, or an
    unknown member."""
    is_sweep, members = _run_python(path)
    if member is None and is_sweep and len(members) == 1:
        member = members[0].name  # a sweep of one spec is that spec
    if member is None and is_sweep:
        names = _some_names(members)
        raise SpecError([SpecIssue("spec", f"the file defines a sweep of {len(members)} specs ({names}); "
                                   "this command takes one", value=str(path), rule="sweep",
                                   hint=f"pick one as {path.name}{MEMBER_SEP}{members[0].name} (validate, plan, "
                                   "compile and submit take the whole sweep)", file=str(path))])
    import copy

    if member is not None:
        chosen = _by_name(members).get(member) if is_sweep else None
        if chosen is None:
            names = _some_names(members) if is_sweep else "none: the file defines one spec"
            raise SpecError([SpecIssue("<file>", "no member of that name in the sweep", value=member,
                                       hint=f"members: {names}", rule="sweep", file=str(path))])
        return copy.deepcopy(chosen.data), dict(chosen.origins)
    return copy.deepcopy(members[0].data), dict(members[0].origins)


#: Keys users bring from Megatron-LM's command line or other trainers -> what a spec writes.
KEY_ALIASES: dict[str, str] = {
    "bf16": '[precision] dtype = "bf16"',
    "fp16": '[precision] dtype = "fp16"',
    "fp32": '[precision] dtype = "fp32"',
    "tp": "[parallel] tensor_model_parallel_size",
    "pp": "[parallel] pipeline_model_parallel_size",
    "vpp": "[parallel] virtual_pipeline_model_parallel_size",
    "cp": "[parallel] context_parallel_size",
    "ep": "[parallel] expert_model_parallel_size",
    "etp": "[parallel] expert_tensor_parallel_size",
    "sp": "[parallel] sequence_parallel = true",
    "dp": "nothing: the data-parallel size is derived (GPUs / (TP x PP x CP))",
    "data_parallel_size": "nothing: the data-parallel size is derived (GPUs / (TP x PP x CP))",
    "swiglu": '[model] activation = "swiglu"',
    "num_key_value_heads": "[model] num_query_groups",
    "head_dim": "[model] kv_channels",
    "intermediate_size": "[model] ffn_hidden_size",
    "num_hidden_layers": "[model] num_layers",
    "rope_theta": "[model] rotary_base",
    "norm_epsilon": "[model] layernorm_epsilon",
    "recompute_granularity": "[recompute] granularity",
    "recompute_method": "[recompute] method",
    "recompute_num_layers": "[recompute] num_layers",
}


def _schema_issue(err: dict[str, Any], origins: dict[str, Origin], path: Path) -> SpecIssue:
    loc = [str(p) for p in err["loc"] if not str(p).startswith("function-")]
    key = ".".join(loc) or "<root>"
    kind = err["type"]
    value = err.get("input") if kind != "missing" else None
    message = err["msg"]
    hint = None
    fix = None
    rule = "schema"
    if kind == "name_placeholder":  # a Spec built in Python; files are checked before (_placeholder_issues)
        key, value, _ = err["ctx"]["problems"][0]
        return _placeholder_issue(key, value, origins, path)
    if kind == "unknown_preset":
        loc = [*loc, "preset"]
        key = ".".join(loc)
        value = err["ctx"]["preset"]
        message = "unknown preset"
        hint = preset_hint(value)
        rule = "unknown-preset"
        close = _close_presets(value)
        if close:
            fix = Fix({key: close[0]})
            hint = hint.replace("? (", f"? {fix.text()} (", 1)
    elif kind in ("extra_forbidden", "no_such_attribute"):  # a key in a file or a dict; an attribute in Python
        model = _model_at(loc[:-1])
        options = list(model.model_fields) if model else []
        from difflib import get_close_matches

        close = get_close_matches(loc[-1], options, n=1)
        message = "unknown key" if kind == "extra_forbidden" else "unknown key: the table has no attribute of this name"
        hint = f"did you mean '{close[0]}'?" if close else (f"valid keys: {', '.join(options)}" if options else None)
        if close:  # the hint names the key; the fix renames it, keeping the value
            fix = Fix({".".join([*loc[:-1], close[0]]): err.get("input")}, (key,))
        if loc[-1].lower() in KEY_ALIASES:
            hint = f"write {KEY_ALIASES[loc[-1].lower()]}"
            fix = None
        written = err.get("input")
        value = None if isinstance(written, (dict, list)) else written  # a scalar shows what was written
    elif kind == "literal_error":
        hint = "use " + message.removeprefix("Input should be ")
        message = "not an allowed value"
        model = _model_at(loc[:-1])
        field = model.model_fields.get(loc[-1]) if model is not None else None
        allowed = [a for a in _literals(field.annotation) if a != value] if field is not None else []
        if allowed:
            fix = Fix({key: allowed[0]})
    elif kind == "missing":
        if loc and loc[0] == "model":
            hint = "add it to the spec, or set [model] preset = \"...\" for the model dimensions"
        elif any(isinstance(p, int) or str(p).isdigit() for p in loc):
            hint = "an item of this list is too short: give every part of it"
        else:
            hint = "add it to the spec"
    elif kind == "int_type" and type(value) is float and math.isfinite(value) and value == int(value):
        message = "a whole number written as a float"
        hint = f"write it as an integer: {key} = {int(value)}"
        if not any(p.isdigit() for p in loc):
            fix = Fix({key: int(value)})
    elif kind in ("int_type", "float_type", "bool_type") and isinstance(value, str) and _unquoted(value, kind, path):
        text, parsed = _unquoted(value, kind, path)
        what = "a boolean" if kind == "bool_type" else "a number"
        message = f"{what} written as a string (quoted)"
        hint = f"write it without quotes: {key} = {text}"
        if not any(p.isdigit() for p in loc):
            fix = Fix({key: parsed})
    elif kind.startswith(("int_", "float_", "bool_", "string_")) or kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        hint = message[0].lower() + message[1:]
        example = _example_value(loc, kind, err.get("ctx") or {})
        if example is not None:
            hint += f", e.g. {loc[-1]} = {example}"
            if example != '"..."' and not any(p.isdigit() for p in loc):
                fix = Fix({key: json.loads(example)})
        message = "wrong type or out of range"
    file, line = locate_key(origins, ".".join(loc), path)
    return SpecIssue(key=key, message=message, value=value, hint=hint, rule=rule, file=file, line=line, fix=fix)


_TRUE_WORDS = frozenset({"true", "yes", "on", "y", "t", "1"})
_FALSE_WORDS = frozenset({"false", "no", "off", "n", "f", "0"})


def _unquoted(value: str, kind: str, path: Path) -> tuple[str, Any] | None:
    """What a quoted number or boolean (``"3e-4"``, ``"256"``, ``"yes"``) means unquoted: ``(text,
    value)`` with ``text`` as the spec's language writes it (TOML, or Python for a ``.py`` spec),
    or ``None`` when ``value`` is no number (``int_type``, ``float_type``) or boolean word
    (``bool_type``) at all."""
    word = value.strip()
    python = path.suffix == ".py"
    if kind == "bool_type":
        truth = True if word.lower() in _TRUE_WORDS else False if word.lower() in _FALSE_WORDS else None
        if truth is None:
            return None
        return (str(truth) if python else str(truth).lower()), truth
    try:
        number: Any = int(word.replace("_", "")) if kind == "int_type" else float(word.replace("_", ""))
    except ValueError:
        if kind != "int_type":
            return None
        try:  # "1e3" for an int: the int it names, when it names one
            as_float = float(word.replace("_", ""))
        except ValueError:
            return None
        if not math.isfinite(as_float) or as_float != int(as_float):
            return None
        number = int(as_float)
        return str(number), number
    if isinstance(number, float) and not math.isfinite(number):
        return None
    return word, number


def _literals(annotation: Any) -> list[Any]:
    """The values of the ``Literal`` in ``annotation`` (inside ``X | None`` too), in order."""
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    return [v for arg in get_args(annotation) for v in _literals(arg)]


def _close_presets(name: str) -> list[str]:
    """The preset ids closest to ``name`` (case and small typos forgiven), best first."""
    from difflib import get_close_matches

    from dlmspec.spec.presets import preset_names

    return get_close_matches(name.lower(), preset_names(), n=3, cutoff=0.5)


def preset_hint(name: str) -> str:
    """What to write instead of the unknown preset id ``name``: the closest ids (case and small
    typos forgiven), else every id."""
    from dlmspec.spec.presets import preset_names

    names = preset_names()
    close = _close_presets(name)
    if close:
        quoted = [f"'{c}'" for c in close]
        options = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
        return f"did you mean {options}? (`dlmspec show --presets` lists every id)"
    return f"use one of {', '.join(names)}"


def _example_value(loc: list[str], kind: str, ctx: dict[str, Any]) -> str | None:
    """A value that passes the field at ``loc``, in TOML: its default when that is a plain
    value within the violated bound, else the bound itself (or the next integer past it)."""
    import json

    model = _model_at(loc[:-1])
    field = model.model_fields.get(loc[-1]) if model else None
    default = None if field is None else field.default
    bound = next((ctx[k] for k in ("gt", "ge", "lt", "le") if k in ctx), None)
    if isinstance(default, bool) or (isinstance(default, (int, float, str)) and default is not None):
        ok = True
        if bound is not None and isinstance(default, (int, float)) and not isinstance(default, bool):
            ok = {"greater_than": default > bound, "greater_than_equal": default >= bound,
                  "less_than": default < bound, "less_than_equal": default <= bound}.get(kind, True)
        if ok:
            return json.dumps(default)
    if isinstance(bound, (int, float)) and not isinstance(bound, bool):
        if kind == "greater_than":
            return json.dumps(bound + 1 if isinstance(bound, int) else bound * 2 or 1.0)
        if kind == "less_than":
            return json.dumps(bound - 1 if isinstance(bound, int) else bound / 2)
        return json.dumps(bound)
    if kind.startswith("int_"):
        return "1"
    if kind.startswith("float_"):
        return "1.0"
    if kind.startswith("bool_"):
        return "true"
    if kind.startswith("string_"):
        return '"..."'
    return None


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    from dlmspec.spec.models import Spec

    model: type[BaseModel] | None = Spec
    for part in loc:
        if model is None or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        model = _first_model(annotation)
    return model


def _first_model(annotation: Any) -> type[BaseModel] | None:
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found:
            return found
    return None



def set_syntax_issue(item: str) -> SpecIssue:
    """The issue for a ``--set`` item that is not ``section.key=value`` (e.g. ``--set train.lr``):
    reported on the command line, with a fix that keeps the user's key where there is one."""
    key = item.partition("=")[0].strip()
    example = (f"--set {key}=VALUE" if key and re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)+", key)
               else "e.g. --set parallel.tensor_model_parallel_size=2")
    return SpecIssue("--set", "expected section.key=value", value=item, hint=example, rule="set",
                     file=COMMAND_LINE)

def load(path: str | Path, overrides: list[str] | tuple[str, ...] = (), *, fast: bool = False) -> LoadedSpec:
    """Load, merge and schema-validate a spec file.

    Args:
        path: a ``.toml`` file or a ``.py`` file that assigns ``spec``.
        overrides: ``"section.key=value"`` strings (``--set``), applied last.
        fast: check a plainly valid spec without pydantic (:func:`dlmspec.spec.fast.check`):
            ``spec`` is then a read-only :class:`~dlmspec.spec.fast.SpecTable` that acts as the
            :class:`~dlmspec.spec.models.Spec` pydantic would build (same values, same
            ``model_fields_set``; other attributes come from that model, built on first use).
            Anything else is validated by pydantic as without ``fast``, so errors are the same.

    Returns:
        The :class:`LoadedSpec`.

    Raises:
        SpecError: unreadable file (missing, a directory, not a regular file, larger than
            :data:`MAX_SPEC_BYTES`), invalid TOML, nesting deeper than :data:`MAX_DEPTH`, an
            ``extends`` chain longer than :data:`MAX_EXTENDS` or circular, integers beyond
            int64, a malformed ``--set``,
            unknown keys, wrong types, out-of-range values (all of them, at once).
    """
    path, member = split_member(path)
    try:
        absolute = path.resolve()
    except (OSError, ValueError, RuntimeError) as exc:  # NUL bytes, symlink loops
        raise SpecError([SpecIssue("<file>", f"not a usable file name: {exc}", value=str(path),
                                   hint="give the path of a .toml or .py spec file", rule="file")]) from None
    if path.suffix == ".py":
        data, origins = _load_python(absolute, member)
        files = _chain_names([str(absolute)], [data])
    else:
        data, origins, files = _load_toml(absolute)
    issues: list[SpecIssue] = []
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*", key):
            issues.append(set_syntax_issue(item))
            continue
        parts = key.split(".")
        try:
            if len(parts) > MAX_DEPTH:
                raise TooDeep(nesting_message())
            value = parse_set_value(text.strip())
            if too_deep(value, MAX_DEPTH - len(parts)) is not None:
                raise TooDeep(nesting_message())
            set_dotted(data, key, value)
        except SetValueError as exc:
            hint = _SPEC_DEPTH_HINT if isinstance(exc, TooDeep) else _INT64_HINT
            issues.append(SpecIssue(_short_key(parts), str(exc), value=_excerpt(item), hint=hint,
                                    rule="set", file="--set"))
            continue
        except ValueError as exc:
            issues.append(SpecIssue(key, str(exc), value=_excerpt(item), rule="set"))
            continue
        origins[key] = ("--set", None)
    if issues:
        raise SpecError(issues)
    issues = (_non_string_keys(data, path) or _int64_issues(data, origins, path)
              or _placeholder_issues(data, origins, path))
    if issues:
        raise SpecError(issues)
    if path.suffix != ".py" and _written_by_dlmspec(absolute, data):
        data = _without_written_defaults(data)
    spec: Any = None
    if fast:
        from dlmspec.spec.fast import check

        spec = check(data)
    if spec is None:
        from pydantic import ValidationError

        from dlmspec.spec.models import Spec

        try:
            spec = Spec.model_validate(data)
        except ValidationError as exc:
            errors = exc.errors()
            error = SpecError([_schema_issue(e, origins, path) for e in errors])
            partial, dropped = _without_bad_keys(data, errors, Spec)
            if partial is not None:
                error.partial = LoadedSpec(spec=partial, path=path, origins=origins, raw=data, files=files)
                error.dropped = dropped
            raise error from None
    return LoadedSpec(spec=spec, path=path, origins=origins, raw=data, files=files)


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


def _without_written_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """A lock's or ``show``'s data without the keys dlmspec wrote for the defaults: each key
    whose value is its default (the preset's, under ``[model]``), and each value the lock
    filled in from resolving the spec (:data:`dlmspec.resolve.LOCK_FILLED_KEYS`) when
    resolving without it gives it back. They are then unset, as in the spec the file was written from, so rules about keys
    "given" (the "has no effect" warnings, ``train-budget``) do not fire on them. The result
    is the same run: when its content hash differs from ``data``'s (or anything fails),
    ``data`` is returned as it is.
    """
    import copy

    try:
        from dlmspec.resolve import LOCK_FILLED_KEYS, locked_spec, resolve
        from dlmspec.spec.models import Spec

        def locked(d: dict[str, Any]) -> str:
            """What :func:`dlmspec.render.compile.content_hash` hashes, as JSON (the canonical
            data of :func:`dlmspec.resolve.locked_spec`; the compiler sits above the loader)."""
            out = locked_spec(resolve(Spec.model_validate(d)))
            return json.dumps(out.model_dump(mode="json", exclude_none=True, exclude={"lock"}), sort_keys=True)

        target = locked(data)
        trimmed = without_defaults(data)
        for key in LOCK_FILLED_KEYS:
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


def _without_bad_keys(data: dict[str, Any], errors: list[dict[str, Any]], model: Any) -> tuple[Any, tuple[str, ...]]:
    """``(spec, dropped keys)``: ``data`` validated without the keys pydantic rejected (unknown
    keys, wrong types, out-of-range values fall back to their defaults), or ``(None, ())`` when
    a required key is among them or the rest still does not validate."""
    import copy

    trimmed = copy.deepcopy(data)
    dropped = []
    for err in errors:
        loc = []
        for part in err["loc"]:
            if not isinstance(part, str) or part.startswith("function-"):
                break  # a list element, or a validator's name: drop the whole key above it
            loc.append(part)
        if err["type"] == "missing" or not loc:
            return None, ()
        node = trimmed
        for part in loc[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(loc[-1], None)
        dropped.append(".".join(loc))
    try:
        return model.model_validate(trimmed), tuple(dropped)
    except Exception:  # noqa: BLE001 - anything left unloadable: no partial spec
        return None, ()


def load_text(text: str, name: str = "<string>.toml") -> LoadedSpec:
    """Load a spec from TOML text (tests and ``dlmspec new``); see :func:`load`."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(name).name
        path.write_text(text, encoding="utf-8")
        try:
            loaded = load(path)
        except SpecError as exc:  # point at `name`, not at the temporary file
            for issue in exc.issues:
                if issue.file in (str(path), str(path.resolve())):
                    issue.file = name
            raise
    loaded.path = Path(name)
    loaded.origins = {k: (name, line) for k, (_, line) in loaded.origins.items()}
    loaded.files = {name: next(iter(loaded.files.values()))}
    return loaded


if __name__ == "__main__":  # pragma: no cover - debugging aid
    print(load(sys.argv[1]).spec.model_dump_json(indent=2))
