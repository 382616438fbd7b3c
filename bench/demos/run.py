"""The stage-demo suite: the demo pre-training stopped and resumed through its compiled launch script
(``--demo resume``), and the SFT demo (``--demo sft``).

    python bench/demos/run.py --demo resume --gpus 1          # ~3 minutes on one GPU
    python bench/demos/run.py --demo sft                      # bench/demos/sft_demo.sh (needs the data kit)
    python bench/demos/run.py --demo resume --dry             # print the commands and the result path

``resume``: ``dlmspec compile specs/demo-dlm.toml`` twice with mock data (random tokens), ``--train-iters``
iterations and a checkpoint every ``--save-interval``: run A is launched, sent SIGTERM (as a
scheduler's stop would) once its metrics.jsonl logs iteration ``--stop-at``, and launched again (it must
save on the signal, resume from that checkpoint and train to the end); run B trains uninterrupted. The
result's values: each launch's exit code and seconds, the iteration A resumed from, and per iteration
after it A's and B's losses with the largest absolute difference (``exact`` when they are equal: the
resume restores the data order, RNG and optimizer state). The result goes to
``bench/results/demos/<date>-<gpu>-<name>.json`` (``bench/schema.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

ROOT = common.ROOT
MOCK = ["data.mock=true", "data.train=[]", "data.valid=[]", 'data.tokenizer={type="NullTokenizer", vocab_size=50256}']


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common(p, precision=None)
    p.add_argument("--demo", choices=["resume", "sft"], required=True)
    p.add_argument("--spec", default=str(ROOT / "specs" / "demo-dlm.toml"))
    p.add_argument("--train-iters", type=int, default=200)
    p.add_argument("--save-interval", type=int, default=50)
    p.add_argument("--stop-at", type=int, default=120, help="SIGTERM run A once this iteration is logged")
    p.add_argument("--timeout-s", type=float, default=600, help="limit of each launch")
    args = p.parse_args(argv)
    if not 0 < args.stop_at < args.train_iters or args.save_interval < 1:
        p.error(f"--stop-at {args.stop_at}: between 1 and --train-iters - 1 ({args.train_iters - 1}); --save-interval >= 1")
    return args


def compile_cmd(args, work: Path, run: str) -> list[str]:
    run_dir = work / run
    sets = MOCK + [f"train.train_iters={args.train_iters}", f"train.lr_warmup_iters={max(1, args.train_iters // 10)}",
                   f"train.eval_interval={args.train_iters}", "train.eval_iters=1", "logging.log_interval=1",
                   f"checkpoint.save_interval={args.save_interval}", f'checkpoint.save="{run_dir}/checkpoints"',
                   f'logging.run_dir="{run_dir}"', f'logging.tensorboard_dir="{run_dir}/tensorboard"',
                   f"cluster.gpus_per_node={args.gpus}"] + ([f'cluster.gpu="{args.gpu}"'] if args.gpu else [])
    return [args.python, "-m", "dlmspec.cli", "compile", str(Path(args.spec).resolve()), "-o", str(work / f"{run}.compiled"),
            "--force"] + [a for s in sets for a in ("--set", s)]


def plan(args, work: Path):
    if args.demo == "sft":
        return [("sft", ["bash", str(ROOT / "bench" / "demos" / "sft_demo.sh"), str(work / "sft")], {})]
    launch = {"DLMSPEC_PYTHON": args.python}
    return [("compile-a", compile_cmd(args, work, "a"), {}), ("compile-b", compile_cmd(args, work, "b"), {}),
            (f"launch-a (SIGTERM after iteration {args.stop_at})", ["bash", str(work / "a.compiled" / "launch.sh")], launch),
            ("relaunch-a", ["bash", str(work / "a.compiled" / "launch.sh")], launch),
            ("launch-b", ["bash", str(work / "b.compiled" / "launch.sh")], launch)]


def losses(metrics: Path) -> dict[int, float]:
    """iteration -> loss of the train records of a metrics.jsonl (:func:`common.read_metrics`; the
    last record of an iteration wins)."""
    return {int(rec["iteration"]): float(rec["loss"]) for rec in common.events(common.read_metrics(metrics), "train")
            if "loss" in rec}


def stop_when_logged(cmd, env, work: Path, metrics: Path, iteration: int, log: Path, timeout_s: float) -> dict:
    """Start ``cmd``; SIGTERM its process group once ``metrics`` logs ``iteration``; wait for it to exit."""
    t0 = time.perf_counter()
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=str(work), env=common.child_env(env), stdout=out, stderr=subprocess.STDOUT,
                                process_group=0)
        sent = None
        while proc.poll() is None and time.perf_counter() - t0 < timeout_s:
            if sent is None and iteration in losses(metrics):
                os.killpg(proc.pid, signal.SIGTERM)
                sent = round(time.perf_counter() - t0, 1)
            time.sleep(0.5)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return {"command": common.show(cmd), "returncode": proc.returncode, "sigterm_at_s": sent,
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    args = parse_args(argv)
    raw = list(sys.argv[1:] if argv is None else argv)
    name = (args.name or f"demo-{args.demo}").lower()
    slurm = common.maybe_slurm(args, raw, "demos")
    if slurm is not None:
        return slurm
    work = common.work_dir(args, "demos")
    steps = plan(args, work)
    if args.dry:
        return common.print_dry(steps, work, common.planned_path(args, "demos", name))
    problem = common.check_installed(args.python, work)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    log = work / "demos.log"
    command = [sys.executable, str(Path(__file__).resolve()), *raw]
    if args.demo == "sft":
        status, record = common.run_steps(steps, work, log, args.timeout_s)
        common.finish(args, "demos", name, command, {"steps": record}, status)
        return 0 if status == "ok" else 1
    status, record = common.run_steps(steps[:2], work, log, args.timeout_s)
    if status == "ok":
        record["launch-a"] = stop_when_logged(steps[2][1], steps[2][2], work, work / "a" / "metrics.jsonl", args.stop_at,
                                              log, args.timeout_s)
        first = dict(losses(work / "a" / "metrics.jsonl"))
        more, more_record = common.run_steps(steps[3:], work, log, args.timeout_s)
        record.update(more_record)
        status = "ok" if more == "ok" and record["launch-a"]["sigterm_at_s"] is not None else "failed"
        a, b = losses(work / "a" / "metrics.jsonl"), losses(work / "b" / "metrics.jsonl")
        stopped = max(first) if first else None
        after = sorted(i for i in a if stopped is not None and i > stopped and i in b)
        diffs = {i: abs(a[i] - b[i]) for i in after}
        values = {"steps": record, "stopped_after_iteration": stopped, "iterations_compared": len(after),
                  "max_abs_loss_difference": max(diffs.values()) if diffs else None,
                  "exact": bool(diffs) and max(diffs.values()) == 0.0,
                  "losses_after_resume": {str(i): {"resumed": a[i], "uninterrupted": b[i]} for i in after}}
        if not after or a.get(args.train_iters) is None:
            status = "failed"
    else:
        values = {"steps": record}
    path = common.finish(args, "demos", name, command, values, status)
    if log.exists():
        import shutil

        shutil.copyfile(log, path.with_suffix(".log"))
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
