"""What every suite launcher (``bench/<suite>/run.py``) shares: its common flags, the versions and
hardware a result records, the child environment, ``--dry`` and ``--slurm``.

No torch import here: ``--dry`` runs on a CPU machine with only dlmspec installed.

Child processes never see the checkout's ``dlmspec/`` folder: they run with :func:`child_cwd` (a
work directory outside the repository) and :func:`child_env` (``PYTHONPATH`` without the repository
root), so ``python -m dlmspec.cli`` and the benchmark scripts import the *installed* dlmspec (whose
``templates`` and ``backends`` are mapped in by ``package-dir``; the checkout's folder has neither).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))

from schema import Result, result_path, utc_today, write_result  # noqa: E402

from dlmspec.cli.runs import METRICS_FILE, iter_metrics  # noqa: E402
from dlmspec.files import FileRefused  # noqa: E402

#: Packages whose versions every result records (``None`` when not installed).
VERSIONED = ("dlmspec", "torch", "megatron-core", "transformer-engine", "transformers", "liger-kernel",
             "torchao", "numpy", "tokenizers", "datasets")


def versions(extra: Sequence[str] = ()) -> dict[str, str | None]:
    """``{"python": "3.12.3", package: version or None, ...}`` from the installed distributions."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in (*VERSIONED, *extra):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def gpu_family(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"h200"``, ``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``; else the first word
    of the model, lower case, letters and digits only (``"cpu"`` for an empty name)."""
    words = name.replace("NVIDIA", "").split()
    for w in words:
        if len(w) >= 2 and w[0].isalpha() and any(c.isdigit() for c in w):
            return "".join(c for c in w.lower() if c.isalnum())
    return "".join(c for c in (words[0] if words else "cpu").lower() if c.isalnum()) or "cpu"


def hardware(gpu_count: int, gpu: str | None = None) -> dict[str, Any]:
    """The machine: GPU family (``--gpu`` or ``nvidia-smi``'s first GPU; ``cpu`` without one), its
    name, memory and driver, how many GPUs the run used, the host's CPU count and platform."""
    info: dict[str, Any] = {"gpu": gpu or "cpu", "gpu_count": gpu_count, "cpus": os.cpu_count(),
                            "platform": platform.platform()}
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        except (OSError, subprocess.SubprocessError):
            out = []
        if out:
            name, mem, driver = (p.strip() for p in (out[0].split(",") + ["", ""])[:3])
            info.update(gpu_name=name, gpu_memory=mem, driver=driver, gpus_on_host=len(out))
            if gpu is None:
                info["gpu"] = gpu_family(name)
    return info


def add_common(p: argparse.ArgumentParser, *, gpus: int = 1, precision: str | None = "bf16") -> None:
    """The flags every launcher has."""
    p.add_argument("--gpus", type=int, default=gpus, help=f"GPUs of one node (default {gpus})")
    if precision is not None:
        p.add_argument("--precision", choices=["bf16", "fp8"], default=precision, help="GEMM precision")
    p.add_argument("--out", default=None, help="results root (default bench/results); the file goes to "
                   "<out>/<suite>/<date>-<gpu>-<name>.json")
    p.add_argument("--name", default=None, help="the <name> part of the result file (default: from the arguments)")
    p.add_argument("--gpu", default=None, help="GPU family in the file name (default: nvidia-smi's, else 'cpu')")
    p.add_argument("--work-dir", default=None, help="run directories (default: a temporary directory outside the checkout)")
    p.add_argument("--python", default=sys.executable, help="interpreter of the child jobs")
    p.add_argument("--dry", action="store_true", help="print the commands and the result path; run nothing (CPU)")
    p.add_argument("--slurm", action="store_true", help="write an sbatch script that runs this launcher on one node "
                   "with --gpus GPUs and submit it (with --dry: print it)")


def results_root(args: argparse.Namespace) -> Path:
    return Path(args.out) if args.out else RESULTS


def planned_path(args: argparse.Namespace, suite: str, name: str) -> Path:
    """Where the launcher's result will go (the date is today's, UTC)."""
    return result_path(results_root(args), suite, utc_today(), args.gpu or ("cpu" if args.dry else _detect_gpu()), name)


def _detect_gpu() -> str:
    return hardware(0)["gpu"]


def work_dir(args: argparse.Namespace, suite: str) -> Path:
    """The launcher's work directory: ``--work-dir`` or a fresh one under the system temp directory.
    Refuses a directory inside the checkout (exit 2), where a child's ``python -m dlmspec...`` would
    import the checkout's ``dlmspec/`` instead of the installed package."""
    import tempfile

    if args.work_dir:
        path = Path(args.work_dir).resolve()
    elif args.dry:
        path = Path(tempfile.gettempdir()) / f"dlmspec-bench-{suite}"
    else:
        path = Path(tempfile.mkdtemp(prefix=f"dlmspec-bench-{suite}-"))
    if path == ROOT or ROOT in path.parents:
        print(f"error: --work-dir {path}: inside the checkout {ROOT}; child jobs started there import the "
              f"checkout's dlmspec/ (no templates, no backends). Give a directory outside it, e.g. /tmp/{suite}.",
              file=sys.stderr)
        raise SystemExit(2)
    if not args.dry:
        path.mkdir(parents=True, exist_ok=True)
    return path


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child job: this one, ``PYTHONUNBUFFERED=1``, and ``PYTHONPATH`` without
    the checkout (an entry whose ``dlmspec`` folder is the checkout's is dropped)."""
    env = dict(os.environ)
    kept = []
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        if not entry:
            continue
        if (Path(entry) / "dlmspec").resolve() == (ROOT / "dlmspec").resolve():
            continue  # the checkout's dlmspec/ would shadow the installed package
        kept.append(entry)
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def check_installed(python: str, cwd: Path) -> str | None:
    """``None`` when ``python`` imports an installed dlmspec with its templates and backends from
    ``cwd`` with :func:`child_env`; else the reason (one line)."""
    probe = ("import dlmspec, dlmspec.templates, dlmspec.backends, pathlib, sys; "
             "print(pathlib.Path(dlmspec.__file__).resolve().parent)")
    try:
        proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120, cwd=str(cwd),
                              env=child_env())
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{python} did not start: {exc}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"{python} cannot import an installed dlmspec: {last} (pip install . or a wheel, not the checkout)"
    return None


#: Import name -> how to get it, for :func:`missing_peers` (the peers and layer paths a suite compares).
PEER_INSTALL = {
    "torch": "pip install 'torch>=2.6' (or an NGC PyTorch container)",
    "transformers": "pip install 'transformers>=4.45' (in dlmspec[runtime])",
    "megatron.core": "pip install 'megatron-core>=0.16.1,<0.20' (in dlmspec[runtime])",
    "transformer_engine.pytorch": "pip install 'transformer-engine[pytorch]' (or an NGC PyTorch container)",
    "dlmspec.cli": "pip install . from the repository root (an installed dlmspec, not the checkout)",
    "liger_kernel.transformers": "pip install liger-kernel (needs triton, i.e. a CUDA machine), "
                                 "or choose --peers plain",
    "torchao.float8": "pip install torchao, or leave out the *-fp8 peers",
}


def missing_peers(checked: dict[str, str], needed_by: dict[str, str]) -> list[str]:
    """One line per module of ``checked`` (module -> ``"ok"`` or the import's error, as a suite's
    import probe reports it) that did not import: ``MODULE (needed by WHO): ERROR; get it: HOW``
    (:data:`PEER_INSTALL`). Keys that are not imports of ``needed_by`` (checks such as
    ``"masked-row loss (stand-in) = plain loss"`` or ``"hf_baseline.load_liger()"``, whose failure
    follows from a missing import listed on its own) are left out."""
    lines = []
    for module, status in checked.items():
        if module not in needed_by or status == "ok":
            continue
        how = PEER_INSTALL.get(module, f"pip install {module.split('.')[0].replace('_', '-')}")
        lines.append(f"{module} (needed by {needed_by[module]}): {status}; get it: {how}")
    return lines


def report_missing(lines: Sequence[str], python: str) -> int:
    """``--dry`` with peers missing: print what is missing and how to get it on stderr; exit code 2
    (0 when ``lines`` is empty)."""
    if not lines:
        return 0
    print(f"error: {len(lines)} {'dependency' if len(lines) == 1 else 'dependencies'} of this run missing "
          f"for {python}:", file=sys.stderr)
    for line in lines:
        print(f"  {line}", file=sys.stderr)
    print("install them, or leave out the peers that need them", file=sys.stderr)
    return 2


def show(cmd: Sequence[str], cwd: Path | None = None) -> str:
    """One shell line of ``cmd`` (``cd DIR && ...`` when it runs elsewhere)."""
    line = shlex.join([str(c) for c in cmd])
    return f"(cd {shlex.quote(str(cwd))} && {line})" if cwd else line


def sbatch_script(argv: Sequence[str], gpus: int, suite: str, time_limit: str = "01:00:00",
                  python: str | None = None) -> str:
    """An sbatch script that runs this launcher (``argv`` without ``--slurm``) on one node with
    ``gpus`` GPUs, from the repository root (the launcher itself starts its jobs outside the
    checkout), under ``python`` (default: the interpreter running this launcher, made absolute,
    so the compute node runs the same environment rather than whatever ``python`` its PATH has)."""
    args = [a for a in argv if a != "--slurm"]
    return "\n".join([
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name=dlmspec-bench-{suite}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={time_limit}",
        "set -euo pipefail",
        f"cd {shlex.quote(str(ROOT))}",
        "srun --ntasks=1 " + shlex.join([os.path.abspath(python or sys.executable), *args]),
        "",
    ])


def maybe_slurm(args: argparse.Namespace, argv: Sequence[str], suite: str) -> int | None:
    """With ``--slurm``: print (``--dry``) or submit the sbatch script of this launcher; returns the
    exit status, or ``None`` without ``--slurm``."""
    if not args.slurm:
        return None
    script = sbatch_script([str(Path(sys.argv[0])), *[a for a in argv if a != "--dry"]], args.gpus, suite)
    if args.dry:
        print(script, end="")
        return 0
    if not shutil.which("sbatch"):
        print("error: --slurm: sbatch is not on PATH (run on a SLURM login node, or drop --slurm)", file=sys.stderr)
        return 2
    return subprocess.run(["sbatch"], input=script, text=True).returncode


def finish(args: argparse.Namespace, suite: str, name: str, command: Sequence[str], values: dict[str, Any],
           status: str, notes: str = "", extra_versions: Sequence[str] = ()) -> Path:
    """Write the result (schema-validated) and print its path."""
    hw = hardware(args.gpus, args.gpu)
    result = Result(suite=suite, name=name, command=[str(c) for c in command], versions=versions(extra_versions),
                    hardware=hw, values=values, status=status, notes=notes)
    path = write_result(result, results_root(args))
    print(f"result: {path}")
    return path


def run_steps(steps: Sequence[tuple[str, list[str], dict[str, str]]], work: Path, log: Path,
              timeout_s: float) -> tuple[str, dict[str, Any]]:
    """Run ``[(step, argv, extra env)]`` one after the other in ``work`` with :func:`child_env`,
    output appended to ``log``; stops at the first failing step. Returns ``(status, {step:
    {"command", "returncode", "seconds", "log_tail"?}})``, status ``ok`` or ``failed``."""
    import time

    record: dict[str, Any] = {}
    for name, cmd, extra in steps:
        print(f"{name}: {show(cmd)}", flush=True)
        t0 = time.perf_counter()
        with open(log, "ab") as out:
            try:
                code = subprocess.run(cmd, cwd=str(work), env=child_env(extra), stdout=out, stderr=subprocess.STDOUT,
                                      timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                code = None
        record[name] = {"command": show(cmd), "returncode": code, "seconds": round(time.perf_counter() - t0, 1)}
        if code != 0:
            tail = log.read_text(errors="replace").splitlines()[-30:]
            record[name]["log_tail"] = tail
            print("\n".join(tail), file=sys.stderr)
            return "failed", record
    return "ok", record


def print_dry(steps: Sequence[tuple[str, list[str], dict[str, str]]], work: Path, path: Path) -> int:
    """``--dry``: each step's shell line, then the result path."""
    for name, cmd, extra in steps:
        env = " ".join(f"{k}={v}" for k, v in extra.items())
        print(f"{name}: {(env + ' ') if env else ''}{show(cmd, work)}")
    print(f"result: {path}")
    return 0


def run_limited(cmd: Sequence[str], cwd: Path, env: dict[str, str], stdout: Any, limit: float,
                grace: float = 10.0, *, stderr: Any = subprocess.STDOUT) -> tuple[int | None, bool]:
    """Run ``cmd`` in its own session (output to the open files ``stdout`` / ``stderr``) for at most
    ``limit`` seconds; past it the whole process group gets SIGTERM (a training saves a checkpoint on
    it), and SIGKILL ``grace`` seconds later. Returns ``(exit code, stopped by the limit)``; the code
    is ``None`` only when the group outlived SIGKILL's 30 s wait."""
    proc = subprocess.Popen(list(cmd), cwd=str(cwd), env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        return proc.wait(timeout=max(0.0, limit)), False
    except subprocess.TimeoutExpired:
        pass  # past the limit: the signals below
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=wait), True
        except subprocess.TimeoutExpired:
            continue
    return proc.poll(), True


class MetricsRows(list):
    """The records (``dict``) of one metrics file, in file order: a ``list``, plus how it was read.

    Attributes:
        path: The file read (``<run dir>/metrics.jsonl`` when a run folder was given).
        found: Whether ``path`` existed (``False``: no run has logged there; the list is empty).
        skipped: Lines left out: not JSON (the last line of a run killed mid-write), not UTF-8,
            or not a JSON object. Blank lines are neither records nor skipped.
        refused: Why reading stopped early, or ``None``: ``path`` is not a regular file (a FIFO,
            a device, a folder), unreadable, or holds a line longer than
            :data:`dlmspec.files.MAX_LINE_BYTES` (the records before that line are kept).
    """

    def __init__(self, path: Path, records: Iterable[dict[str, Any]] = ()) -> None:
        super().__init__(records)
        self.path = path
        self.found = False
        self.skipped = 0
        self.refused: str | None = None


def metrics_path(path_or_run_dir: str | os.PathLike[str]) -> Path:
    """The metrics file of ``path_or_run_dir``: ``<dir>/metrics.jsonl`` for a folder (a run's
    ``[logging] run_dir``), else the path itself (a copy under another name, as a GPU call's
    tarball holds: ``metrics-rl.jsonl``)."""
    path = Path(path_or_run_dir)
    return path / METRICS_FILE if path.is_dir() else path


def read_metrics(path_or_run_dir: str | os.PathLike[str]) -> MetricsRows:
    """Every record of a run's ``metrics.jsonl`` (``backends/megatron/metrics.py``: one JSON object
    a line with ``"event"`` ``start`` / ``train`` / ``valid`` / ``eval`` / ``checkpoint`` /
    ``host_launch`` / ``resume`` / ``exit``), read by the compiler's reader
    (:func:`dlmspec.cli.runs.iter_metrics`: :func:`dlmspec.files.iter_lines`, a regular file, each
    line capped) - the one reader every bench script uses.

    Never raises on what a run left behind: a missing file gives an empty list (``found`` false);
    a line that is not a JSON object (a truncated last line, a list, garbage) is skipped and
    counted (``skipped``); a file that is not a regular one, or a line past the cap, ends the
    reading with the records read so far and the reason in ``refused``.

    Args:
        path_or_run_dir: A run folder, or a metrics file (any name).

    Returns:
        :class:`MetricsRows`: a ``list`` of the records (dicts), in file order (a resumed run's
        launches one after the other).
    """
    rows = MetricsRows(metrics_path(path_or_run_dir))
    if not os.path.lexists(rows.path):
        return rows
    rows.found = True
    try:
        for record in iter_metrics(rows.path):
            if record is None:
                rows.skipped += 1
            else:
                rows.append(record)
    except FileRefused as exc:
        rows.refused = f"{exc.why} (fix: {exc.hint})"
    return rows


def events(rows: Iterable[dict[str, Any]], *names: str) -> list[dict[str, Any]]:
    """The records whose ``"event"`` is one of ``names`` (``events(rows, "valid", "eval")``), in order."""
    return [r for r in rows if r.get("event") in names]


def last(rows: Iterable[dict[str, Any]], *names: str) -> dict[str, Any] | None:
    """The last record whose ``"event"`` is one of ``names``, or ``None``."""
    found = events(rows, *names)
    return found[-1] if found else None
