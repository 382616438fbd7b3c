"""The UTC dates a call may stamp on what it writes: a launcher names its result after today's UTC date
(bench/schema.py ``utc_today``), and a test that runs across midnight must accept the date before the
call and the date after it."""

from __future__ import annotations

from typing import Callable, TypeVar

from bench.schema import utc_today

T = TypeVar("T")


def call_with_dates(fn: Callable[[], T]) -> tuple[T, set[str]]:
    """Run ``fn()``; return its value and the UTC dates it may have used (one date, or two across midnight)."""
    before = utc_today()
    value = fn()
    return value, {before, utc_today()}
