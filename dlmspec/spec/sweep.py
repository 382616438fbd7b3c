"""A Python spec's sweep: its members (:class:`_Member`: name, data, origins), how a member is named
on the command line (``FILE.py::NAME``, :func:`split_member`) and the checks of the whole sweep
(:func:`_checked_sweep`: distinct names and checkpoint folders, at most :data:`MAX_SWEEP_MEMBERS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmspec.errors import Fix, SpecError, SpecIssue
from dlmspec.spec.dotted import parse_set_value, set_dotted
from dlmspec.spec.lines import Origin, locate_key

#: What a spec file name may end with to pick one member of a Python sweep: ``FILE.py::NAME``.
MEMBER_SEP = "::"


@dataclass
class _Member:
    """One spec of a Python spec file: its name, data (as a TOML file would hold it) and origins."""

    name: str
    data: dict[str, Any]
    origins: dict[str, Origin]


def split_member(path: str | Path) -> tuple[Path, str | None]:
    """``FILE.py::NAME`` -> ``(FILE.py, NAME)``; any other path -> ``(path, None)``."""
    text = str(path)
    head, sep, member = text.rpartition(MEMBER_SEP)
    if sep and head.endswith(".py") and member:
        return Path(head), member
    return Path(path), None


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


#: Most members a Python sweep may have (a generator is read up to one more, so one that never
#: ends stops there instead of filling the memory).
MAX_SWEEP_MEMBERS = 10_000


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
