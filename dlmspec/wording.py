"""Counts and durations in printed text: ``1 GPU``, ``2 GPUs``, ``1 microbatch``, ``4 microbatches``;
``48.7 ms``, ``1.25 s``, ``3.2 h``.

Every message that prints a count with its noun goes through :func:`count`, so a count of one
never reads "1 GPUs" or "1 GPU(s)"; the planner's durations go through :func:`duration`.
"""

from __future__ import annotations

#: Nouns whose plural is not the singular plus "s".
_PLURALS = {"microbatch": "microbatches", "batch": "batches", "process": "processes", "entry": "entries",
            "conversation has": "conversations have", "is": "are"}


def plural(word: str, n: int) -> str:
    """``word`` for ``n`` things: itself for 1 (and -1), else its plural (``"GPU"`` -> ``"GPUs"``,
    ``"microbatch"`` -> ``"microbatches"``)."""
    if abs(n) == 1:
        return word
    return _PLURALS.get(word, word + "s")


def count(n: int, word: str, *, sep: str = ",") -> str:
    """``n`` and ``word`` in agreement: ``count(1, "GPU")`` = ``"1 GPU"``, ``count(1200, "step")`` =
    ``"1,200 steps"`` (``sep``: the thousands separator format, ``""`` for none)."""
    number = format(n, sep) if sep else str(n)
    return f"{number} {plural(word, n)}"


def duration(seconds: float) -> str:
    """``seconds`` in the unit that reads best: days, hours or minutes from a minute up, seconds
    (two decimals) from one second, else milliseconds (one decimal)."""
    if seconds >= 86400:
        return f"{seconds / 86400:,.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:,.1f} min"
    if seconds >= 1:
        return f"{seconds:,.2f} s"
    return f"{seconds * 1000:,.1f} ms"
