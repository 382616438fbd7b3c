"""Compile everything a GPU session runs, here on the CPU machine, into ``.device/`` (ignored by git,
carried to the GPU machine by the device tool).

* ``.device/plan/NAME/``: one compiled directory per entry of ``bench/plan/matrix.json`` (the
  planner's calibration matrix), with the entry's ``--set`` overrides plus a run directory and a
  checkpoint directory of its own, so runs never resume from each other.
* ``.device/demo/``: ``specs/demo-dlm.toml`` compiled as it is (real data from ``.data/``, made
  by ``dlmspec data prepare`` as README.md shows), and ``.device/demo-ref/``, the same in run
  and checkpoint directories of its own (the uninterrupted run of ``demo_resume.sh``).

Usage: ``.venv/bin/python bench/gpu/prepare.py [--gpus 1|2] [NAME ...]``
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=None, help="only matrix entries for this many GPUs")
    parser.add_argument("--demo", action="store_true", help="also compile the demo into .device/demo")
    parser.add_argument("--profile", default=None, metavar="A:B",
                        help="compile the chosen entries into .device/profile/NAME-profile instead, with "
                             "[logging] profile over steps A..B-1 on every rank")
    parser.add_argument("names", nargs="*", help="matrix entries (default: all runnable ones)")
    args = parser.parse_args()
    matrix = json.loads((ROOT / "bench/plan/matrix.json").read_text())
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
