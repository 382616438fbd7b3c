"""The unit tier: tests that import no torch or megatron-core at module level and start no process.

Besides the syntax check (tests/unit/suite/test_suite_rules.py), every unit test runs with process
creation refused: a test here that starts one (itself, or through the code it calls) fails with the
file to move and where to.
"""

from __future__ import annotations

import _posixsubprocess
import importlib.util
import os
import subprocess

import pytest


class ProcessStarted(AssertionError):
    """A unit test started a process."""


@pytest.fixture(scope="session", autouse=True)
def _matplotlib_font_cache():
    """matplotlib builds its font cache on first import and runs ``fc-list`` to do it: built once per
    session, before any test's guard, so the tests that draw (``dlmspec plot``, ``fit --plot``) pass
    on a machine where matplotlib never ran."""
    if importlib.util.find_spec("matplotlib") is not None:
        import matplotlib.font_manager  # noqa: F401


@pytest.fixture(autouse=True)
def _no_process(request, monkeypatch):
    where = request.node.path.relative_to(request.config.rootpath)
    concern = where.parts[2] if len(where.parts) > 3 else "<concern>"

    def refuse(*args, **kwargs):
        raise ProcessStarted(
            f"{where} starts a process: unit tests run in-process. "
            f"Move the module to tests/integration/{concern}/ (git mv), or call the code in-process "
            "(typer's CliRunner for the CLI).")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuse)  # multiprocessing's spawn and forkserver
    for name in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execvp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
