"""Reading a task's prompts file: JSONL, one ``{"prompt": str, "answer": str, ...}`` object a line
(blank lines skipped; other keys kept, e.g. ``id``), as ``dlmspec task make`` writes it. Used by
validate (rule ``eval-generation-prompts``), the runtime's generation evaluation and
``dlmspec eval --task``. Read through :mod:`dlmspec.files` (regular files only, bounded lines,
bounded nesting). Plain Python: no torch import.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from dlmspec.files import FileRefused, iter_lines, loads_json

__all__ = ["TaskFileError", "read_task_rows", "MAX_TASK_LINE_BYTES"]

#: Longest line of a prompts file (a GSM8K row is under 2 KiB).
MAX_TASK_LINE_BYTES = 1 << 20


class TaskFileError(ValueError):
    """A prompts file dlmspec cannot use: ``path``, ``line`` (1-based; ``None`` for the whole
    file), ``why`` and a ``fix``. ``str()`` is ``"PATH:LINE: WHY. Fix: FIX"``."""

    def __init__(self, path: str, line: Optional[int], why: str, fix: str) -> None:
        self.path, self.line, self.why, self.fix = str(path), line, why, fix
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {why}. Fix: {fix}")


_ROW_FIX = 'one JSON object a line: {"prompt": "...", "answer": "..."} (dlmspec task make writes such files)'


def read_task_rows(path: str | os.PathLike[str], *, max_rows: Optional[int] = None) -> List[Dict[str, Any]]:
    """The first ``max_rows`` rows (all when ``None``) of the prompts file ``path``, each checked:
    a JSON object with a non-empty string ``prompt`` and a string ``answer``.

    Raises:
        TaskFileError: the file cannot be read (missing, not a regular file, a line over
            :data:`MAX_TASK_LINE_BYTES`), a row is not such an object (its line named), or the
            file has no row.
    """
    rows: List[Dict[str, Any]] = []
    try:
        for number, raw in iter_lines(path, max_line_bytes=MAX_TASK_LINE_BYTES, what="prompts file"):
            if max_rows is not None and len(rows) >= max_rows:
                break
            if not raw.strip():
                continue
            try:
                row = loads_json(raw, where=path, what="prompts file")
            except FileRefused as exc:
                raise TaskFileError(str(path), number, f"not JSON ({exc.why})", _ROW_FIX) from None
            if not isinstance(row, dict):
                raise TaskFileError(str(path), number, f"a JSON {type(row).__name__}, not an object", _ROW_FIX)
            for key in ("prompt", "answer"):
                if key not in row:
                    raise TaskFileError(str(path), number, f"no {key!r} key", _ROW_FIX)
                if not isinstance(row[key], str):
                    raise TaskFileError(str(path), number, f"{key!r} is a {type(row[key]).__name__}, not a string",
                                        _ROW_FIX)
            if not row["prompt"].strip():
                raise TaskFileError(str(path), number, "an empty prompt", "a prompt with text")
            rows.append(row)
    except FileRefused as exc:
        raise TaskFileError(exc.path, None, exc.why, exc.hint) from None
    if not rows:
        raise TaskFileError(str(path), None, "no rows", _ROW_FIX)
    return rows
