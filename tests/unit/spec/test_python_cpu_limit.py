"""A Python spec file's own code runs under a CPU-time limit (dlmspec/spec/load.py,
MAX_PYTHON_CPU_S): a file that loops is exit 2 at its line, even when it catches Exception."""

from __future__ import annotations

import pytest

from dlmspec.errors import SpecError
from dlmspec.spec import load as spec_load
from dlmspec.spec import python_load


def test_a_spec_file_that_loops_is_stopped_at_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(python_load, "MAX_PYTHON_CPU_S", 0.5)
    path = tmp_path / "loops.py"
    path.write_text("from dlmspec.dsl import Spec\nspec = Spec.load('demo-dlm')\nx = 0\nwhile True:\n"
                    "    try:\n        x += 1\n    except Exception:\n        pass\n")
    with pytest.raises(SpecError) as info:
        spec_load.load(path)
    (issue,) = info.value.issues
    assert "CPU time" in issue.message and issue.line in (4, 5, 6, 7, 8) and issue.hint


def test_the_timer_and_handler_are_restored_after_a_spec_file(tmp_path):
    import signal

    before = signal.getsignal(signal.SIGPROF)
    path = tmp_path / "ok.py"
    path.write_text("from dlmspec.dsl import Spec\nspec = Spec.load('demo-dlm')\n")
    spec_load.load(path)
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0) and signal.getsignal(signal.SIGPROF) is before
