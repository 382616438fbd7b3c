"""The tests that hold a machine-wide resource (tests/conftest.py's EXCLUSIVE group: the SLURM
cluster, two-rank gloo worlds, torchrun ports) run on one pytest-xdist worker under
``--dist loadgroup``, README's test command.

Two ways this silently broke before: pytest-xdist's own collection hook ran before ours and
renamed the node ids before our mark existed, and pytest 9.2's structured node ids made xdist's
renaming a no-op (pytest-dev/pytest-xdist#1386). Both let two workers start and stop the one
SLURM cluster under each other's jobs. This runs a real two-worker session and reads where each
test ran.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GROUPED = "tests/integration/slurm/test_submit_chain.py"      # in EXCLUSIVE_MODULES, fake sbatch: fast
FREE = "tests/unit/data/test_repetition_accounting.py"        # not grouped, 16 quick tests: work for the other worker


def test_exclusive_tests_run_on_one_worker_under_loadgroup() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-o", "addopts=",
         "-p", "no:cacheprovider", GROUPED, FREE],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    ran = re.findall(r"^\[(gw\d+)\] .*?(PASSED|SKIPPED) (\S+)", result.stdout, flags=re.M)
    grouped = [(worker, nodeid) for worker, _, nodeid in ran if nodeid.startswith(GROUPED)]
    assert len(grouped) >= 5, result.stdout[-3000:]
    assert all(nodeid.endswith("@exclusive") for _, nodeid in grouped), grouped
    assert len({worker for worker, _ in grouped}) == 1, grouped
