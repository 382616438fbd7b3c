"""How long ``dlmspec validate SPEC`` and ``dlmspec plan SPEC`` take, end to end, as a user runs them.

The speed asked of validate and plan: each under 0.3 s wall on the CI machine (2 cores, no GPU, otherwise idle).
Each run is a fresh ``python -m dlmspec.cli COMMAND SPEC`` process, so interpreter start-up,
imports (pydantic, the planner, rich when a table is printed) and the work are all counted.
Reports, per command and spec: wall seconds and CPU seconds (user + sys of the child) as min,
median and p90 of ``--runs`` runs, the exit code, and the biggest imports (``-X importtime``,
cumulative, microseconds); and for the machine: CPU count, load average before and after, and
the wall times of ``python -c pass`` and of importing pydantic (the floor of any command that
validates with pydantic). The benchmark's own runs keep the load average near 1; above that,
other work shares the 2 cores and wall times overstate an idle machine's (CPU times less so).
``--instructions`` also counts the instructions of one run under valgrind (callgrind's ``Ir``):
the same on a busy machine as on an idle one, so changes can be compared on a shared machine
(on this 2-core machine, idle, about 2e9 instructions take a second at the median, 2.9e9 at
the fastest run).

Bytecode: the first run of a fresh checkout compiles every module; ordinary use has the
``.pyc`` files. Runs here use a private ``PYTHONPYCACHEPREFIX`` warmed by one untimed run, and
clear ``PYTHONDONTWRITEBYTECODE`` (some sandboxes set it, which makes every run recompile
dlmspec: ``--no-bytecode`` measures that case).

    python bench/validate/bench_validate.py                      # both commands, the bundled specs, 20 runs each
    python bench/validate/bench_validate.py specs/demo-dlm.toml --commands plan --runs 30
    python bench/validate/bench_validate.py --json bench/validate/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET_SECONDS = 0.3
COMMANDS = ("validate", "plan")


def _env(cache: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    else:
        env["PYTHONPYCACHEPREFIX"] = cache
    return env


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall seconds, child CPU seconds, the process) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done


def _stats(values: list[float]) -> dict[str, float]:
    """min, median and p90 (nearest rank) of ``values``, seconds."""
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, max(0, -(-9 * len(ordered) // 10) - 1))]
    return {"min": ordered[0], "median": statistics.median(ordered), "p90": p90}


def _imports(argv: list[str], env: dict[str, str], top: int) -> list[tuple[str, int]]:
    """The ``top`` modules with the largest cumulative import time that are not inside another
    listed one, microseconds."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True)
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        depth = (len(name) - len(name.lstrip())) // 2
        if depth == 0:  # top-level imports only: their times add up
            rows.append((name.strip(), int(cumulative)))
    return sorted(rows, key=lambda r: -r[1])[:top]


def _instructions(argv: list[str], env: dict[str, str]) -> int | None:
    """Instructions one run executes (valgrind callgrind ``Ir``, user space); None without valgrind."""
    with tempfile.NamedTemporaryFile() as out:
        try:
            done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}", *argv],
                                  cwd=ROOT, env=env, capture_output=True, text=True)
        except FileNotFoundError:
            return None
    for line in done.stderr.splitlines():
        if "Collected :" in line:
            return int(line.split(":")[-1])
    return None


def bench(command: str, spec: str, runs: int, cache: str | None, instructions: bool = False) -> dict:
    argv = [sys.executable, "-m", "dlmspec.cli", command, spec]
    env = _env(cache)
    _, _, first = _run(argv, env)  # warms the bytecode cache
    if first.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(argv)} failed:\n{first.stderr}")
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu, _ = _run(argv, env)
        walls.append(wall)
        cpus.append(cpu)
    return {
        "command": command,
        "spec": spec,
        "exit_code": first.returncode,
        "printed_issues": bool(first.stderr.strip()),  # a warning table (rich) on stderr
        "runs": runs,
        "wall_s": _stats(walls),
        "cpu_s": _stats(cpus),
        "top_imports_us": _imports(argv, env, 8),
        "instructions": _instructions(argv, env) if instructions else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="*", help="default: specs/*.toml")
    parser.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--no-bytecode", action="store_true", help="every run recompiles (PYTHONDONTWRITEBYTECODE=1)")
    parser.add_argument("--instructions", action="store_true", help="also count one run's instructions (valgrind)")
    parser.add_argument("--json", help="also write the results here (with the command line)")
    args = parser.parse_args()
    specs = args.specs or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "specs").glob("*.toml"))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as cache:
        env = _env(None if args.no_bytecode else cache)
        startup = _stats([_run([sys.executable, "-c", "pass"], env)[0] for _ in range(10)])
        # The floor of any command that validates with pydantic: the interpreter plus pydantic's import.
        pydantic_floor = _stats([_run([sys.executable, "-c", "from pydantic import BaseModel, Field"], env)[0]
                                 for _ in range(10)])
        results = [bench(command, spec, args.runs, None if args.no_bytecode else cache, args.instructions)
                   for command in args.commands for spec in specs]
    load_after = os.getloadavg()
    for r in results:
        verdict = "ok" if r["wall_s"]["median"] < TARGET_SECONDS else "OVER"
        w, c = r["wall_s"], r["cpu_s"]
        extra = " (printed issues)" if r["printed_issues"] else ""
        if r["instructions"] is not None:
            extra += f"; {r['instructions'] / 1e6:,.0f}M instructions"
        print(f"{r['command']:8} {r['spec']}: wall min {w['min']:.3f} median {w['median']:.3f} p90 {w['p90']:.3f} s; "
              f"cpu min {c['min']:.3f} median {c['median']:.3f} p90 {c['p90']:.3f} s [{verdict} vs {TARGET_SECONDS} s]"
              f"{extra}")
    print("largest imports of the first (ms, cumulative):",
          ", ".join(f"{name} {us / 1000:.0f}" for name, us in results[0]["top_imports_us"]))
    print(f"python -c pass: wall median {startup['median']:.3f} s; python -c 'from pydantic import BaseModel, "
          f"Field': wall median {pydantic_floor['median']:.3f} s (min {pydantic_floor['min']:.3f}); "
          f"{os.cpu_count()} CPUs; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after (wall times on a loaded machine overstate an "
          "idle one's: compare CPU times)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": " ".join(["python", Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "load_average_before": load_before, "load_average_after": load_after,
            "bytecode_cached": not args.no_bytecode, "target_s": TARGET_SECONDS,
            "python_startup_wall_s": startup, "pydantic_import_wall_s": pydantic_floor, "results": results,
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
