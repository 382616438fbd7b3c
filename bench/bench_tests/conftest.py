"""bench/bench_tests: the launchers (``--dry``), the result schema, the calibration build and the citations."""

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one OpenMP thread a process, as tests/conftest.py says why

ROOT = Path(__file__).resolve().parents[2]
for p in (str(ROOT), str(ROOT / "bench")):
    if p not in sys.path:
        sys.path.insert(0, p)
