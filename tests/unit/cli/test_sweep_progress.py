"""Long sweeps show a progress bar on stderr when it is a terminal, after the first second;
piped output never sees one."""

from __future__ import annotations

import io
import sys
import time

import pytest

from dlmspec.cli.output import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_slow_sweep_shows_progress_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Terminal()
    monkeypatch.setattr(sys, "stderr", fake)
    seen = []
    for item in progress(list(range(5)), "validating 5 members", after=0.0):
        time.sleep(0.01)
        seen.append(item)
    assert seen == list(range(5)) and "validating 5 members" in fake.getvalue()


def test_piped_stderr_gets_no_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = io.StringIO()
    monkeypatch.setattr(sys, "stderr", fake)
    assert list(progress(list(range(5)), "validating 5 members", after=0.0)) == list(range(5))
    assert fake.getvalue() == ""
