"""The UTC dates a call may stamp on what it writes: a launcher names its result after today's UTC date,
and a test that runs across midnight must accept the date before the call and the date after it."""

from __future__ import annotations

import datetime as dt
from typing import Callable, TypeVar

T = TypeVar("T")


def utc_today() -> str:
    """Today's UTC date, ``YYYY-MM-DD`` (what bench/schema.py names results after)."""
    return dt.datetime.now(dt.timezone.utc).date().isoformat()


def call_with_dates(fn: Callable[[], T]) -> tuple[T, set[str]]:
    """Run ``fn()``; return its value and the UTC dates it may have used (one date, or two across midnight)."""
    before = utc_today()
    value = fn()
    return value, {before, utc_today()}
