"""CPU check mode of ``launch.sbatch``: prove a launch works without GPUs.

``DLMSPEC_CHECK_MODE=env sbatch launch.sbatch`` runs, in every process the script starts::

    python -m dlmspec.backends.launch.check --report PATH --nodes N --nproc-per-node G \\
        --launcher torchrun|srun [--expect-env NAME=VALUE ...]

Each process joins ``torch.distributed.init_process_group("gloo")`` from the environment
(``env://``: ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``), all-reduces a tensor,
and sends rank 0 what it saw (rank, local rank, node, SLURM's ids, the expected variables).
Rank 0 checks world size, ranks, local ranks, processes per node, the rendezvous host (the
allocation's first node) and port (derived from the job id), the environment the spec asked for
and the all-reduce sum, and writes a JSON report (``"ok"``, ``"errors"``, what each rank saw).
Exit 0 when every check passes, 1 otherwise (2 for bad arguments, or a checkpoint marker that is
not one).

``DLMSPEC_CHECK_MODE=train`` adds ``--train --state-dir DIR``: a simulated long job. It resumes
from ``DIR/checkpoint.json`` when present, then runs ``--steps`` steps of ``--step-seconds``
each (an all-reduce per step, progress in ``DIR/progress.json``). On SIGUSR1 or SIGTERM the
ranks agree at the next step (a max all-reduce of the "signalled" flag, as
``backends/megatron/signals.py`` does), rank 0 writes the checkpoint marker, and every rank
exits with :data:`REQUEUE_EXIT_CODE`, which makes the batch script requeue the job; the next run
reads the marker and continues. After the last step rank 0 writes ``DIR/report.json`` with the
runs (start step, end step, how each ended).

Secrets are never written: for ``WANDB_API_KEY`` and ``HF_TOKEN`` the report says only whether
they are set. Needs torch (CPU is enough); of dlmspec only the exit code (:mod:`dlmspec.errors`) and
:mod:`dlmspec.files` (no pydantic).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from dlmspec.errors import REQUEUE_EXIT_CODE
from dlmspec.files import FileRefused, default_mode, read_json, write_atomic

#: ``MASTER_PORT = PORT_BASE + SLURM_JOB_ID % PORT_SPAN``, as ``dlmspec.render.sbatch.rendezvous_port``.
PORT_BASE = 10000
PORT_SPAN = 20000

#: Secrets whose presence (never value) the report records.
SECRETS = ("WANDB_API_KEY", "HF_TOKEN")

_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODEID", "SLURM_PROCID", "SLURM_LOCALID",
               "SLURM_NTASKS", "SLURMD_NODENAME", "SLURM_RESTART_COUNT")


class CheckError(Exception):
    """A problem that stops the check before a report can be agreed on."""


def _int_env(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise CheckError(f"{name} is not set: the launcher must set it (torchrun, or the srun wrapper)")
    try:
        return int(value)
    except ValueError:
        raise CheckError(f"{name}={value!r} is not an integer") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module doc); ``--steps``/``--step-seconds`` default to
    ``DLMSPEC_CHECK_STEPS`` (100) and ``DLMSPEC_CHECK_STEP_SECONDS`` (0.5)."""
    parser = argparse.ArgumentParser(prog="python -m dlmspec.backends.launch.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, help="env mode: where rank 0 writes the JSON report")
    parser.add_argument("--train", action="store_true", help="simulated long job (needs --state-dir)")
    parser.add_argument("--state-dir", type=Path, help="train mode: checkpoint marker, progress and report")
    parser.add_argument("--steps", type=int, default=int(os.environ.get("DLMSPEC_CHECK_STEPS", "100")))
    parser.add_argument("--step-seconds", type=float,
                        default=float(os.environ.get("DLMSPEC_CHECK_STEP_SECONDS", "0.5")))
    parser.add_argument("--nodes", type=int, required=True, help="nodes the spec asks for")
    parser.add_argument("--nproc-per-node", type=int, required=True, help="processes per node (GPUs per node)")
    parser.add_argument("--launcher", choices=("torchrun", "srun"), required=True)
    parser.add_argument("--expect-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable every process must see with this value (repeatable)")
    parser.add_argument("--timeout", type=float, default=120.0, help="rendezvous and collective timeout, s")
    args = parser.parse_args(argv)
    if args.train == (args.report is not None):
        parser.error("give either --report PATH (env check) or --train --state-dir DIR")
    if args.train and args.state_dir is None:
        parser.error("--train needs --state-dir DIR")
    if args.steps < 1 or args.step_seconds < 0:
        parser.error("--steps must be >= 1 and --step-seconds >= 0")
    for item in args.expect_env:
        if "=" not in item:
            parser.error(f"--expect-env {item!r}: expected NAME=VALUE")
    return args


def local_facts(expected_env: dict[str, str]) -> dict[str, Any]:
    """What this process sees: torch's rendezvous variables, SLURM's ids, the expected
    variables' values (only those), and whether each secret is set."""
    return {
        "rank": _int_env("RANK"),
        "world_size": _int_env("WORLD_SIZE"),
        "local_rank": _int_env("LOCAL_RANK"),
        "local_world_size": _int_env("LOCAL_WORLD_SIZE"),
        "group_rank": int(os.environ["GROUP_RANK"]) if os.environ.get("GROUP_RANK", "").isdigit() else None,
        "master_addr": os.environ.get("MASTER_ADDR"),
        "master_port": os.environ.get("MASTER_PORT"),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "slurm": {name: os.environ.get(name) for name in _SLURM_VARS},
        "env": {name: os.environ.get(name) for name in sorted(expected_env)},
        "secrets_set": {name: bool(os.environ.get(name)) for name in SECRETS},
    }


def check_world(facts: list[dict[str, Any]], args: argparse.Namespace, expected_env: dict[str, str],
                allreduce_sum: float) -> list[str]:
    """Every disagreement between what the ranks saw and what the spec asked for (empty: all
    good). ``facts`` is :func:`local_facts` of every rank, in rank order."""
    errors: list[str] = []
    world = args.nodes * args.nproc_per_node
    if len(facts) != world:
        errors.append(f"world size {len(facts)}, the spec asks for {args.nodes} node(s) x {args.nproc_per_node}")
    ranks = [f["rank"] for f in facts]
    if ranks != list(range(len(facts))):
        errors.append(f"ranks are {ranks}, expected 0..{len(facts) - 1} once each")
    for f in facts:
        if f["world_size"] != world:
            errors.append(f"rank {f['rank']}: WORLD_SIZE={f['world_size']}, expected {world}")
        if f["local_world_size"] != args.nproc_per_node:
            errors.append(f"rank {f['rank']}: LOCAL_WORLD_SIZE={f['local_world_size']}, expected {args.nproc_per_node}")
    nodes: dict[str, list[int]] = {}
    for f in facts:
        node = f["slurm"].get("SLURMD_NODENAME") or f["hostname"]
        nodes.setdefault(node, []).append(f["local_rank"])
    if len(nodes) != args.nodes:
        errors.append(f"processes ran on {len(nodes)} node(s) ({', '.join(sorted(nodes))}), expected {args.nodes}")
    for node, local in sorted(nodes.items()):
        if sorted(local) != list(range(args.nproc_per_node)):
            errors.append(f"node {node}: local ranks {sorted(local)}, expected 0..{args.nproc_per_node - 1}")
    addrs = {f["master_addr"] for f in facts}
    ports = {f["master_port"] for f in facts}
    if len(addrs) != 1 or len(ports) != 1:
        errors.append(f"ranks disagree on the rendezvous: MASTER_ADDR {sorted(map(str, addrs))}, "
                      f"MASTER_PORT {sorted(map(str, ports))}")
    first = facts[0] if facts else None
    if first is not None and first["slurm"].get("SLURM_JOB_ID"):
        rank0_node = first["slurm"].get("SLURMD_NODENAME") or first["hostname"]
        if first["master_addr"] != rank0_node:
            errors.append(f"MASTER_ADDR={first['master_addr']}, expected rank 0's node {rank0_node} "
                          "(the allocation's first node)")
        try:
            port = PORT_BASE + int(first["slurm"]["SLURM_JOB_ID"]) % PORT_SPAN
        except ValueError:
            port = None
        if port is not None and first["master_port"] != str(port):
            errors.append(f"MASTER_PORT={first['master_port']}, expected {port} (from job id "
                          f"{first['slurm']['SLURM_JOB_ID']})")
    for f in facts:
        slurm = f["slurm"]
        if args.launcher == "srun" and slurm.get("SLURM_PROCID") is not None:
            if slurm["SLURM_PROCID"] != str(f["rank"]) or slurm.get("SLURM_LOCALID") != str(f["local_rank"]):
                errors.append(f"rank {f['rank']}: RANK/LOCAL_RANK {f['rank']}/{f['local_rank']} differ from "
                              f"SLURM_PROCID/SLURM_LOCALID {slurm['SLURM_PROCID']}/{slurm.get('SLURM_LOCALID')}")
        if args.launcher == "torchrun" and slurm.get("SLURM_NODEID") is not None:
            if f["group_rank"] is None or str(f["group_rank"]) != slurm["SLURM_NODEID"]:
                errors.append(f"rank {f['rank']}: torchrun node rank {f['group_rank']} differs from "
                              f"SLURM_NODEID {slurm['SLURM_NODEID']}")
        for name, value in sorted(expected_env.items()):
            if f["env"].get(name) != value:
                errors.append(f"rank {f['rank']}: {name}={f['env'].get(name)!r}, the spec sets {value!r}")
    expected_sum = len(facts) * (len(facts) + 1) / 2
    if allreduce_sum != expected_sum:
        errors.append(f"all-reduce of rank+1 gave {allreduce_sum}, expected {expected_sum}")
    return errors


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (:func:`dlmspec.files.write_atomic`: a temporary file
    created exclusively beside it, never through a link, then renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=default_mode())


class MarkerRefused(CheckError):
    """The checkpoint marker is there but is not one this check wrote (exit 2)."""


def read_marker(path: Path) -> dict[str, Any] | None:
    """The checkpoint marker ``{"step": int >= 0, "runs": [{...}, ...]}`` at ``path``, or ``None``
    when there is none (read with :func:`dlmspec.files.read_json`: a regular file, at most 1 MiB).

    Raises:
        MarkerRefused: not a regular file, too large or deep, not JSON, or not that shape.
    """
    if not os.path.lexists(path):
        return None
    fix = f"remove {path} to start the simulated job from step 0"
    try:
        data = read_json(path, limit=1 << 20, what="checkpoint marker")
    except FileRefused as exc:
        raise MarkerRefused(f"{exc.path}: {exc.why}. Fix: {fix}") from None
    step = data.get("step") if isinstance(data, dict) else None
    runs = data.get("runs") if isinstance(data, dict) else None
    if (not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(runs, list)
            or not all(isinstance(r, dict) for r in runs)):
        raise MarkerRefused(f"{path}: not a checkpoint marker (expected {{\"step\": N >= 0, \"runs\": [...]}}). "
                            f"Fix: {fix}")
    return data


class _Signals:
    """Records SIGUSR1/SIGTERM; the loop acts on them at a step boundary."""

    def __init__(self) -> None:
        self.received: str | None = None
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name


def _run(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    expected_env = dict(item.split("=", 1) for item in args.expect_env)
    signals = _Signals() if args.train else None
    facts = local_facts(expected_env)
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=args.timeout))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, facts)
        errors = check_world(gathered, args, expected_env, float(value.item()))
        report: dict[str, Any] = {
            "ok": not errors,
            "errors": errors,
            "mode": "train" if args.train else "env",
            "launcher": args.launcher,
            "world_size": world,
            "expected": {"nodes": args.nodes, "nproc_per_node": args.nproc_per_node, "env": expected_env},
            "allreduce_sum": value.item(),
            "ranks": gathered,
        }
        if not args.train:
            if rank == 0:
                _write_json(args.report, report)
                print(f"check: {'ok' if not errors else 'FAILED'}: report in {args.report}", file=sys.stderr)
            dist.barrier()
            return 0 if not errors else 1
        return _train(args, rank, report, signals)
    finally:
        dist.destroy_process_group()


def _train(args: argparse.Namespace, rank: int, report: dict[str, Any], signals: _Signals | None) -> int:
    """The simulated long job (see the module doc); returns the exit code."""
    import torch
    import torch.distributed as dist

    state = args.state_dir
    marker = state / "checkpoint.json"
    job = os.environ.get("SLURM_JOB_ID")
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    saved: list[Any] = [None]
    if rank == 0:
        try:
            saved[0] = read_marker(marker)
        except MarkerRefused as exc:  # every rank stops with it (none waits on a broadcast that never comes)
            saved[0] = {"refused": str(exc)}
    dist.broadcast_object_list(saved, src=0)
    if saved[0] is not None and "refused" in saved[0]:
        raise MarkerRefused(saved[0]["refused"])
    start = int(saved[0]["step"]) if saved[0] else 0
    runs = list(saved[0]["runs"]) if saved[0] else []
    if rank == 0:
        print(f"check: train run {len(runs)} (job {job}, restart {restart}) starts at step {start}"
              f"{' (resumed from the checkpoint marker)' if saved[0] else ''}", file=sys.stderr)
    total = torch.zeros(1)
    step = start
    while step < args.steps:
        time.sleep(args.step_seconds)
        flag = torch.tensor([1.0 if signals is not None and signals.received else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            runs.append({"job_id": job, "restart_count": restart, "start_step": start, "end_step": step,
                         "ended": f"checkpoint on {signals.received if signals and signals.received else 'a signal'}"})
            if rank == 0:
                _write_json(marker, {"step": step, "runs": runs})
                print(f"check: signal: checkpoint marker at step {step}; exit {REQUEUE_EXIT_CODE} for requeue",
                      file=sys.stderr)
            dist.barrier()
            return REQUEUE_EXIT_CODE
        one = torch.ones(1)
        dist.all_reduce(one, op=dist.ReduceOp.SUM)
        total += one
        step += 1
        if rank == 0:
            _write_json(state / "progress.json", {"step": step, "steps": args.steps, "job_id": job,
                                                  "restart_count": restart})
    runs.append({"job_id": job, "restart_count": restart, "start_step": start, "end_step": step, "ended": "completed"})
    if rank == 0:
        report = dict(report, final_step=step, steps=args.steps, runs=runs,
                      resumed=any(r["ended"].startswith("checkpoint") for r in runs[:-1]))
        _write_json(state / "report.json", report)
        _write_json(marker, {"step": step, "runs": runs})
        print(f"check: train completed at step {step}; report in {state / 'report.json'}", file=sys.stderr)
    dist.barrier()
    return 0 if report["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (errors are one line on stderr, no traceback)."""
    args = parse_args(argv)
    try:
        return _run(args)
    except MarkerRefused as exc:
        print(f"check: error: {exc}", file=sys.stderr)
        return 2
    except CheckError as exc:
        print(f"check: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a launch problem is reported in one line
        print(f"check: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
