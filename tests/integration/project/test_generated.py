"""dlmspec.generated: every generated file is what its sources give today (regenerating changes
nothing), and each one starts with the one marker line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dlmspec import generated

ROOT = Path(__file__).resolve().parents[3]


def test_regenerating_every_target_changes_nothing() -> None:
    """`python -m dlmspec.generated --check` exits 0 and each target's file equals its build's text
    (after changing a source, such as dlmspec/spec/models.py or a CLI option, run
    `python -m dlmspec.generated`)."""
    assert generated.TARGETS, "no generated file registered"
    for target in generated.TARGETS:
        text = generated.build_text(target)
        assert text.startswith(generated.MARKER + "\n"), target.path
        assert (ROOT / target.path).read_text(encoding="utf-8") == text, \
            f"{target.path} is stale: run python -m dlmspec.generated"
    done = subprocess.run([sys.executable, "-m", "dlmspec.generated", "--check"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (done.returncode, done.stderr) == (0, "")
