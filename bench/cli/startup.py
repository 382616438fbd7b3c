"""How long the commands users run most take from a fresh process: ``dlmspec validate SPEC``,
``dlmspec plan SPEC`` and ``dlmspec --help`` (target: under 0.3 s median on a 2-core machine).

Each run is ``python -m dlmspec.cli ARGS`` in a new process (interpreter start-up, imports and the
work all counted), timed with ``time.perf_counter`` around ``subprocess.run``; one untimed run of
each command first warms the bytecode cache. Prints JSON: per command the median, min and max wall
seconds of ``--runs`` runs, the median CPU seconds (user + sys of the child: steadier than wall
time on a busy machine) and the exit code, and the machine's CPU count and load average before
and after (other work on a shared machine inflates wall times).

    python bench/cli/startup.py                        # 20 runs each, specs/demo-dlm.toml
    python bench/cli/startup.py --runs 30 --root /path/to/other/checkout   # time another checkout
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def time_command(args: list[str], runs: int, root: Path) -> dict[str, object]:
    """Wall seconds of ``runs`` fresh ``python -m dlmspec.cli *args`` processes run in ``root``
    (with ``root`` first on ``PYTHONPATH``)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    command = [sys.executable, "-m", "dlmspec.cli", *args]
    first = subprocess.run(command, cwd=root, env=env, capture_output=True)
    times, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(command, cwd=root, env=env, capture_output=True)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return {"argv": ["dlmspec", *args], "exit_code": first.returncode, "median_s": round(statistics.median(times), 4),
            "min_s": round(min(times), 4), "max_s": round(max(times), 4),
            "cpu_median_s": round(statistics.median(cpu), 4), "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--spec", default="specs/demo-dlm.toml")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to time (default: this one)")
    options = parser.parse_args()
    commands = {"validate": ["validate", options.spec], "plan": ["plan", options.spec], "help": ["--help"]}
    load_before = os.getloadavg()
    results = {name: time_command(args, options.runs, options.root.resolve()) for name, args in commands.items()}
    print(json.dumps({"root": str(options.root.resolve()), "cpus": os.cpu_count(),
                      "loadavg_before": [round(x, 2) for x in load_before],
                      "loadavg_after": [round(x, 2) for x in os.getloadavg()], "commands": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
