"""Python spec files: run once per process and version of the file, under a CPU limit
(:data:`MAX_PYTHON_CPU_S`), recording where each value was set (:mod:`dlmspec.spec.python`); the
file assigns ``spec`` (one spec) or a sweep (a list of specs, each a member ``FILE.py::NAME``:
:func:`sweep_targets`). The user's exceptions become issues naming the line of the file.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlmspec.errors import SpecError, SpecIssue, display_path, printable_int, safe_repr
from dlmspec.spec.dotted import LONG_NUMBER, MAX_DEPTH, nesting_message, too_deep
from dlmspec.spec.lines import Origin, _leading_keys, locate_key
from dlmspec.spec.read import _SPEC_DEPTH_HINT, _check_file
from dlmspec.spec.schema_errors import _first_model, _placeholder_issue, _schema_issue, _short_key, _short_repr
from dlmspec.spec.sweep import (MAX_SWEEP_MEMBERS, MEMBER_SEP, _Member, _by_name, _checked_sweep, _overridden,
                                _some_names, split_member)

#: Python spec files already run in this process: (file, mtime_ns, size) -> members, or None for
#: a file that assigns one spec (its member is the only entry then).
_RUNS: dict[tuple[str, int, int], tuple[bool, list[_Member]]] = {}


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
    from dlmspec.spec.models import OBJECTIVE_TAGS

    for model in OBJECTIVE_TAGS.values():  # an objective's own spec model (Objective.spec_model)
        out.setdefault(model.__name__, "objective")
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
                                   hint=f"pick one as {display_path(str(path))}{MEMBER_SEP}{members[0].name} (validate, plan, "
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
