"""Compile everything a GPU session runs, here on the CPU machine, into ``.device/`` (ignored by git,
carried to the GPU machine by the device tool).

* ``.device/plan/NAME/``: one compiled directory per entry of ``bench/plan/matrix.json`` (the
  planner's calibration matrix), with the entry's ``--set`` overrides plus a run directory and a
  checkpoint directory of its own, so runs never resume from each other.
* ``.device/demo/``: ``specs/demo-dlm.toml`` compiled as it is (real data from ``.data/``, made
  by ``dlmspec data prepare`` as README.md shows), and ``.device/demo-ref/``, the same in run
  and checkpoint directories of its own (the uninterrupted run of ``demo_resume.sh``).

``--max-iters N`` shortens each entry to at most N steps (``train.train_iters`` and
``train.eval_interval``; the matrix's 50-step demo runs log every 5 steps, so 40 leaves six steady
intervals after iteration 10, what ``run_matrix.sh`` takes the median of).

Usage: ``.venv/bin/python bench/gpu/prepare.py [--gpus 1|2] [--max-iters N] [--matrix FILE] [NAME ...]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DLMSPEC = [sys.executable, "-m", "dlmspec.cli"]


def compile_spec(base: str, out: Path, overrides: list[str]) -> None:
    """Run ``dlmspec compile base -o out --force --set ...``; raise on failure."""
    cmd = DLMSPEC + ["compile", base, "-o", str(out), "--force"]
    for item in overrides:
        cmd += ["--set", item]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"compile failed for {out}:\n{result.stdout}\n{result.stderr}")


def shorten(overrides: list[str], max_iters: int) -> list[str]:
    """``--set`` values that cut an entry to at most ``max_iters`` steps: its last
    ``train.train_iters`` (and ``train.eval_interval``) override, capped."""
    iters = evals = None
    for item in overrides:
        key, _, value = item.partition("=")
        if key == "train.train_iters":
            iters = int(value)
        elif key == "train.eval_interval":
            evals = int(value)
    out = []
    if iters is None or iters > max_iters:
        out.append(f"train.train_iters={max_iters}")
    if evals is not None and evals > max_iters:
        out.append(f"train.eval_interval={max_iters}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=None, help="only matrix entries for this many GPUs")
    parser.add_argument("--demo", action="store_true", help="also compile the demo into .device/demo")
    parser.add_argument("--profile", default=None, metavar="A:B",
                        help="compile the chosen entries into .device/profile/NAME-profile instead, with "
                             "[logging] profile over steps A..B-1 on every rank")
    parser.add_argument("--max-iters", type=int, default=None, metavar="N",
                        help="at most N training steps per entry (train_iters and eval_interval)")
    parser.add_argument("--matrix", default="bench/plan/matrix.json",
                        help="the entries' file (default: the calibration matrix; bench/plan/holdout.json "
                             "holds configurations kept out of the calibration)")
    parser.add_argument("names", nargs="*", help="matrix entries (default: all runnable ones)")
    args = parser.parse_args()
    matrix = json.loads((ROOT / args.matrix).read_text())
    chosen = []
    for entry in matrix:
        if args.names and entry["name"] not in args.names:
            continue
        if args.gpus and entry["gpus"] != args.gpus:
            continue
        if entry.get("errors"):
            print(f"skip {entry['name']}: {entry['errors']}")
            continue
        chosen.append(entry)
    root = ROOT / ".device" / ("profile" if args.profile else "plan")
    for entry in chosen:
        name = entry["name"] + ("-profile" if args.profile else "")
        out = root / name
        if out.exists():
            shutil.rmtree(out)
        run_dir = f".device/runs/{name}"
        extra = []
        if args.profile:
            start, end = args.profile.split(":")
            ranks = list(range(entry["gpus"]))
            extra = ["logging.profile=true", f"logging.profile_step_start={start}",
                     f"logging.profile_step_end={end}", f"logging.profile_ranks={ranks}"]
        if args.max_iters:
            extra += shorten(entry["overrides"], args.max_iters)
        compile_spec(entry["base"], out, entry["overrides"] + extra + [
            f'logging.run_dir="{run_dir}"', f'logging.tensorboard_dir="{run_dir}/tensorboard"',
            f'checkpoint.save="{run_dir}/ckpt"', "checkpoint.save_at_end=false"])
        print(f"compiled {entry['name']} ({entry['gpus']} GPU) -> {out.relative_to(ROOT)}")
    if args.demo:
        out = ROOT / ".device" / "demo"
        if out.exists():
            shutil.rmtree(out)
        compile_spec("specs/demo-dlm.toml", out, [])
        print(f"compiled the demo -> {out.relative_to(ROOT)}")
        # The same demo in run and checkpoint directories of its own: the uninterrupted run
        # that bench/gpu/demo_resume.sh compares a stopped-and-resumed run with.
        ref = ROOT / ".device" / "demo-ref"
        if ref.exists():
            shutil.rmtree(ref)
        compile_spec("specs/demo-dlm.toml", ref, [
            'logging.run_dir="runs/demo-ref"', 'logging.tensorboard_dir="runs/demo-ref/tensorboard"',
            'checkpoint.save="runs/demo-ref/checkpoints"'])
        print(f"compiled the uninterrupted reference demo -> {ref.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
