"""The RL stage's prompt file: JSON lines ``{"prompt": TEXT, "answer": TEXT, ...}``.

Each non-blank line is one JSON object with

- ``"prompt"``: a non-empty string (the stage renders it with the SFT stage's chat template);
- ``"answer"``: a string or an integer (kept as its decimal text), what ``builtin:exact_match``
  compares the completion's final answer with; required unless ``require_answer = False``;
- ``"prompt_id"`` (optional): a string or an integer naming the row in reward failure reports;
  by default ``"<file name>:<line>"``. Two rows may not share one;
- any other fields: kept, handed to the reward functions as keyword arguments (``**row``).

The file is read with :func:`dlmspec.files.iter_lines` (a regular file only, no line longer than
``dlmspec.files.MAX_LINE_BYTES``, at most :data:`MAX_PROMPT_FILE_BYTES` in all, UTF-8, nested at
most ``dlmspec.files.MAX_NESTING`` levels). A malformed row is a :class:`PromptFileError` naming
the file and line (``on_error = "error"``) or is skipped and counted (``"skip"``, as the SFT
stage's ``on_error``); a problem with the file itself is always an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from dlmspec.files import FileRefused, iter_lines, loads_json

#: Largest prompt file read, bytes (GSM8K's training set is ~4 MiB).
MAX_PROMPT_FILE_BYTES = 256 << 20

ON_ERROR = ("error", "skip")

__all__ = ["MAX_PROMPT_FILE_BYTES", "ON_ERROR", "PromptFileError", "read_prompts"]

_EXAMPLE = '{"prompt": "What is 2 + 3?", "answer": "5"}'


class PromptFileError(FileRefused):
    """A prompt file or one of its rows that cannot be used: ``path``, ``line`` (1-based, or
    ``None`` for the file as a whole), ``why`` and ``hint``. ``str()`` is one line,
    ``"PATH:LINE: WHY. Fix: HINT"``; a :class:`~dlmspec.files.FileRefused`, so the command line
    exits with code 2."""

    def __init__(self, path: str | os.PathLike[str], line: Optional[int], why: str,
                 hint: str = f"one JSON object per line, e.g. {_EXAMPLE}") -> None:
        super().__init__(f"{path}:{line}" if line is not None else path, why, hint)
        self.path = str(path)
        self.line = line


def _text_problem(text: str) -> Optional[str]:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"character {exc.start} is a lone surrogate (U+{ord(text[exc.start]):04X}), not text"
    return None


def _check_row(row: Any, require_answer: bool) -> Tuple[Optional[Dict[str, Any]], Optional[str], Optional[str]]:
    """``(row, None, None)`` or ``(None, why, hint)``."""
    if not isinstance(row, dict):
        return None, f"the row is a JSON {type(row).__name__}, not an object", f"write the row as an object: {_EXAMPLE}"
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        why = "the row has no 'prompt'" if "prompt" not in row else (
            f"'prompt' is {type(prompt).__name__}, not text" if not isinstance(prompt, str) else "'prompt' is empty")
        return None, why, f"give each row a non-empty \"prompt\" string: {_EXAMPLE}"
    problem = _text_problem(prompt)
    if problem:
        return None, f"'prompt': {problem}", "write the prompt as valid UTF-8 text"
    if "answer" in row:
        answer = row["answer"]
        if isinstance(answer, bool) or not isinstance(answer, (str, int)):
            return None, f"'answer' is {type(answer).__name__} {answer!r}, not text", \
                'write the answer as a string, e.g. "answer": "72"'
        if isinstance(answer, str) and _text_problem(answer):
            return None, f"'answer': {_text_problem(answer)}", "write the answer as valid UTF-8 text"
        row["answer"] = str(answer)
    elif require_answer:
        return None, "the row has no 'answer'", f"give each row the reference \"answer\" the rewards check: {_EXAMPLE}"
    if "prompt_id" in row:
        pid = row["prompt_id"]
        if isinstance(pid, bool) or not isinstance(pid, (str, int)) or (isinstance(pid, str) and not pid):
            return None, f"'prompt_id' is {type(pid).__name__} {pid!r}", \
                'make "prompt_id" a non-empty string or an integer, or leave it out (file:line is used)'
    return row, None, None


def read_prompts(path: str | os.PathLike[str], *, on_error: str = "error",
                 require_answer: bool = True) -> Tuple[List[Dict[str, Any]], int]:
    """The rows of the prompt file ``path`` (module docstring) and how many were skipped.

    Args:
        path: the JSON-lines file.
        on_error: ``"error"`` (a malformed row raises) or ``"skip"`` (skipped and counted).
        require_answer: whether every row needs an ``"answer"``.

    Returns:
        ``(rows, skipped)``: each row a dict with ``"prompt"``, ``"prompt_id"``, ``"answer"`` (when
        given) and the line's other fields, in file order.

    Raises:
        PromptFileError: the file is missing, not a regular file, larger than
            :data:`MAX_PROMPT_FILE_BYTES`, has a line too long or no usable row; with
            ``on_error = "error"``, a row that is not JSON, not an object, without a non-empty
            ``prompt`` (or ``answer``), with a bad field, or repeating a ``prompt_id``.
        ValueError: ``on_error`` is not one of :data:`ON_ERROR`.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error = {on_error!r}: use 'error' or 'skip'")
    name = Path(path).name
    rows: List[Dict[str, Any]] = []
    seen: Dict[Any, int] = {}
    skipped = 0
    total = 0
    try:
        for number, raw in iter_lines(path, what="prompt file"):
            total += len(raw) + 1
            if total > MAX_PROMPT_FILE_BYTES:
                raise PromptFileError(path, None, f"the prompt file is larger than {MAX_PROMPT_FILE_BYTES >> 20} MiB",
                                      "split it into smaller files, or point at the right file")
            if not raw.strip():
                continue
            why: Optional[str] = None
            hint: Optional[str] = None
            row: Optional[Dict[str, Any]] = None
            try:
                parsed = loads_json(raw, where=path, what=f"line {number}")
            except FileRefused as exc:
                why, hint = f"line {number} is not JSON ({exc.why})", f"one JSON object per line, e.g. {_EXAMPLE}"
            else:
                row, why, hint = _check_row(parsed, require_answer)
                if row is not None:
                    pid = row.setdefault("prompt_id", f"{name}:{number}")
                    if pid in seen:
                        row, why = None, f"'prompt_id' {pid!r} repeats line {seen[pid]}'s"
                        hint = "give each row its own prompt_id, or leave prompt_id out (file:line is used)"
                    else:
                        seen[pid] = number
            if row is None:
                if on_error == "error":
                    raise PromptFileError(path, number, why, hint)
                skipped += 1
                continue
            rows.append(row)
    except PromptFileError:
        raise
    except FileRefused as exc:
        raise PromptFileError(path, None, exc.why, exc.hint) from None
    if not rows:
        raise PromptFileError(path, None, "the prompt file has no usable row" + (f" ({skipped} skipped)" if skipped else ""),
                              f"write one JSON object per line, e.g. {_EXAMPLE}")
    return rows, skipped
