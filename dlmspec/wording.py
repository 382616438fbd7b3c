"""Counts in printed text: ``1 GPU``, ``2 GPUs``, ``1 microbatch``, ``4 microbatches``.

Every message that prints a count with its noun goes through :func:`count`, so a count of one
never reads "1 GPUs" or "1 GPU(s)".
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
