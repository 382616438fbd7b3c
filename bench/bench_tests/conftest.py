"""bench/bench_tests: the launchers (``--dry``), the result schema, the calibration build and the citations."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (str(ROOT), str(ROOT / "bench")):
    if p not in sys.path:
        sys.path.insert(0, p)
