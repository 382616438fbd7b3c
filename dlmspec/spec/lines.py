"""The TOML line map of a spec file: which line each dotted key was written on (:func:`line_map`),
and where a key's value came from (:data:`Origin`, :func:`locate_key`): the loader records one
``(file, line)`` per key so that every issue points at the line to edit.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dlmspec.spec.dotted import MAX_DEPTH

#: Where a key was written: ``(file, line)``; line is None for keys from a Python spec.
Origin = tuple[str, int | None]


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


def _leading_keys(path: tuple[Any, ...]) -> list[str]:
    """The keys at the start of ``path``, up to its first list index."""
    keys = []
    for part in path:
        if not isinstance(part, str):
            break
        keys.append(part)
    return keys


def _line_of(lines: dict[str, int], key: str) -> int | None:
    """The line of ``key``, else of its nearest ancestor in ``lines`` (a key inside an inline
    table or an array: ``env = { NAME = ... }``)."""
    while key:
        if key in lines:
            return lines[key]
        key = key.rpartition(".")[0]
    return None
