"""Compile the Megatron-FSDP GPU checks into ``.device/`` (ignored by git, carried to the GPU machine).

* ``.device/plan/demo-fsdp/``: the calibration entry ``demo-fsdp`` of ``bench/plan/matrix.json``
  (as ``bench/gpu/prepare.py demo-fsdp`` compiles it), for the planner's memory and step time;
* ``.device/fsdp-resume/``: the same run, 40 steps, checkpointing every 20 steps into
  ``.device/runs/fsdp-resume/ckpt``, for ``bench/devbox/gpu/fsdp_resume.sh``'s save-and-resume check.

Usage: ``.venv/bin/python bench/gpu/prepare_fsdp.py``
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from prepare import compile_spec  # noqa: E402

RESUME_RUN = ".device/runs/fsdp-resume"


def main() -> None:
    subprocess.run([sys.executable, str(ROOT / "bench/gpu/prepare.py"), "demo-fsdp"], cwd=ROOT, check=True)
    entry = next(e for e in json.loads((ROOT / "bench/plan/matrix.json").read_text()) if e["name"] == "demo-fsdp")
    out = ROOT / ".device" / "fsdp-resume"
    if out.exists():
        shutil.rmtree(out)
    compile_spec(entry["base"], out, entry["overrides"] + [
        "train.train_iters=40", "train.eval_interval=20", "checkpoint.save_interval=20",
        "checkpoint.save_at_end=true", f'checkpoint.save="{RESUME_RUN}/ckpt"',
        f'logging.run_dir="{RESUME_RUN}"', f'logging.tensorboard_dir="{RESUME_RUN}/tensorboard"'])
    print(f"compiled the save-and-resume run -> {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
