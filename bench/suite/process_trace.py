"""Where the test suite's CPU goes, process by process: a start-up hook for a virtual environment that
records each Python process's own CPU time at exit, and a report of the records.

The hook (``install``) puts a ``.pth`` file and its module into the environment's site-packages. It is
inert unless ``DLMSPEC_PROCESS_TRACE`` names a file: then every Python process of that environment
appends one JSON line at exit: ``pid``, ``argv`` (first five, shortened), ``cpu`` (its own user +
system seconds, ``resource.getrusage(RUSAGE_SELF)``, children not included), ``wall``, whether it
imported ``torch``, ``megatron.core`` and ``transformers``, and ``test``: ``PYTEST_CURRENT_TEST`` as it
inherited it (the test that started it; empty where a test gave its child an environment of its own),
and ``xdist_worker`` (``PYTEST_XDIST_WORKER``).
A process that leaves through ``os._exit`` (forked fuzz and hostile cases, killed processes) writes
nothing.

    python bench/suite/process_trace.py install --venv .venv
    DLMSPEC_PROCESS_TRACE=/tmp/trace.jsonl .venv/bin/python -m pytest -n auto --dist loadgroup
    python bench/suite/process_trace.py report /tmp/trace.jsonl
    python bench/suite/process_trace.py uninstall --venv .venv
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

MODULE = "_dlmspec_process_trace"
PTH = "zz_dlmspec_process_trace.pth"
HOOK = '''"""Appends this process's CPU time at exit to $DLMSPEC_PROCESS_TRACE (bench/suite/process_trace.py)."""
import atexit, contextlib, json, os, resource, sys, time

_PATH = os.environ.get("DLMSPEC_PROCESS_TRACE")
_T0 = time.time()


def _record():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    rec = {"pid": os.getpid(), "argv": [str(a)[:160] for a in sys.argv[:5]],
           "cpu": ru.ru_utime + ru.ru_stime, "wall": time.time() - _T0,
           "torch": "torch" in sys.modules, "megatron": "megatron.core" in sys.modules,
           "transformers": "transformers" in sys.modules, "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
           "xdist_worker": os.environ.get("PYTEST_XDIST_WORKER", "")}
    with contextlib.suppress(OSError):  # an unwritable trace file never fails the traced process
        with open(_PATH, "a") as f:
            f.write(json.dumps(rec) + "\\n")


if _PATH:
    atexit.register(_record)
'''


def site_packages(venv: Path) -> Path:
    """The site-packages folder of the environment whose interpreter is ``venv/bin/python``."""
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def install(site: Path) -> List[Path]:
    """Write the hook into ``site``; returns the two files written."""
    (site / f"{MODULE}.py").write_text(HOOK)
    (site / PTH).write_text(f"import {MODULE}\n")
    return [site / f"{MODULE}.py", site / PTH]


def uninstall(site: Path) -> List[Path]:
    """Remove the hook's files from ``site``; returns those that were there (the compiled module that
    Python caches in ``__pycache__`` is removed too, not returned; the folder goes when it is left empty)."""
    gone = []
    for path in (site / PTH, site / f"{MODULE}.py"):
        if path.exists():
            path.unlink()
            gone.append(path)
    cache = site / "__pycache__"
    for compiled in cache.glob(f"{MODULE}.*.pyc"):
        compiled.unlink()
    if cache.is_dir() and not any(cache.iterdir()):
        cache.rmdir()
    return gone


def read(path: Path) -> List[Dict[str, Any]]:
    """The records of a trace file (a line that does not parse is left out)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("cpu"), (int, float)):
            out.append(rec)
    return out


def _is_worker(rec: Dict[str, Any]) -> bool:
    """A pytest process itself: the controller (``pytest`` in its command line) or an xdist worker (it
    has ``PYTEST_XDIST_WORKER`` and, at exit, no current test; a test's child inherits the test)."""
    if rec.get("test"):
        return False
    return bool(rec.get("xdist_worker")) or any("pytest" in a for a in rec.get("argv", []))


def kind(rec: Dict[str, Any]) -> str:
    """``megatron``, ``torch`` or ``light``: the heaviest of what the process imported."""
    return "megatron" if rec.get("megatron") else "torch" if rec.get("torch") else "light"


def summary(records: Iterable[Dict[str, Any]], top: int = 20) -> Dict[str, Any]:
    """Totals: the pytest processes' own CPU, the subprocesses' by kind and by the test that started them."""
    records = list(records)
    workers = [r for r in records if _is_worker(r)]
    subs = [r for r in records if not _is_worker(r)]
    by_kind: Dict[str, Dict[str, float]] = collections.defaultdict(lambda: {"processes": 0, "cpu_s": 0.0})
    by_test: Dict[str, float] = collections.Counter()
    by_command: Dict[str, float] = collections.Counter()
    for r in subs:
        k = by_kind[kind(r)]
        k["processes"] += 1
        k["cpu_s"] += float(r["cpu"])
        by_test[(r.get("test") or "").split("::")[0] or "(no test in its environment)"] += float(r["cpu"])
        by_command[" ".join(Path(a).name if "/" in a else a for a in r.get("argv", [])[:3])] += float(r["cpu"])
    return {"pytest_processes": len(workers), "pytest_cpu_s": sum(float(r["cpu"]) for r in workers),
            "subprocesses": len(subs), "subprocess_cpu_s": sum(float(r["cpu"]) for r in subs),
            "by_kind": dict(by_kind), "by_test": by_test.most_common(top), "by_command": by_command.most_common(top)}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    for name in ("install", "uninstall"):
        s = sub.add_parser(name)
        s.add_argument("--venv", type=Path, default=Path(".venv"))
    r = sub.add_parser("report")
    r.add_argument("trace", type=Path)
    r.add_argument("--top", type=int, default=20)
    r.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.what in ("install", "uninstall"):
        if not (a.venv / "bin" / "python").exists():
            print(f"--venv {a.venv}: no bin/python there; pass the virtual environment the tests run in", file=sys.stderr)
            return 2
        site = site_packages(a.venv)
        done = install(site) if a.what == "install" else uninstall(site)
        print(f"{a.what}: " + (", ".join(str(x) for x in done) or "nothing was installed"))
        return 0
    if not a.trace.is_file():
        print(f"{a.trace}: no such trace file (run the tests with DLMSPEC_PROCESS_TRACE={a.trace})", file=sys.stderr)
        return 2
    s = summary(read(a.trace), a.top)
    if a.json:
        print(json.dumps(s, indent=1))
        return 0
    print(f"pytest processes: {s['pytest_processes']}, {s['pytest_cpu_s']:,.0f} CPU-s; "
          f"subprocesses: {s['subprocesses']}, {s['subprocess_cpu_s']:,.0f} CPU-s")
    for k, v in sorted(s["by_kind"].items()):
        print(f"  {k:9s} {v['processes']:5d} processes {v['cpu_s']:8,.0f} CPU-s")
    print("subprocess CPU by the test that started it:")
    for name, cpu in s["by_test"]:
        print(f"  {cpu:8,.1f}  {name}")
    print("by command:")
    for name, cpu in s["by_command"]:
        print(f"  {cpu:8,.1f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
