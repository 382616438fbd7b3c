"""Compile what bench/devbox/gpu/runtime_checks.sh runs (train.py's start and resume checks)
into ``.device/checks/``, here on the CPU machine (the GPU machine has no jinja2).

Every variant is ``specs/demo-dlm.toml`` shortened to 40 steps (warm-up 5, a checkpoint and an
evaluation every 20 steps), in one run directory ``.device/runs/checks`` so that each resumes
from the one before:

* ``base``: the run as written (0 -> 40);
* ``longer``: ``train_iters = 60`` and ``lr = 5e-4`` (allowed on resume: the schedule follows);
* ``shape``: ``num_layers = 6`` (a resume must refuse it, exit 2);
* ``full``: ``longer`` saving into ``/tmp/dlmspec-small/ckpt`` (a small tmpfs the script mounts,
  so the save at step 60 meets a full disk); loads from there too;
* ``badbin``: ``base`` reading ``.device/checks/data/cut_text_document`` (a truncated copy the
  script makes) in a run directory of its own: must refuse to start, exit 2.

Usage: ``.venv/bin/python bench/gpu/prepare_checks.py`` (needs the demo's inputs in ``.data/``,
which ``bench/gpu/prepare.py`` makes from ``../shared/data``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from dlmspec.render.compile import compile_spec

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".device" / "checks"
RUN = ".device/runs/checks"
COMMON = ["train.train_iters=40", "train.lr_warmup_iters=5", "checkpoint.save_interval=20",
          "train.eval_interval=20", "train.eval_iters=2", "logging.log_interval=10",
          f'logging.run_dir="{RUN}"', f'logging.tensorboard_dir="{RUN}/tensorboard"', f'checkpoint.save="{RUN}/ckpt"']
LONGER = ["train.train_iters=60", "train.lr=5e-4"]
VARIANTS = {
    "base": [],
    "longer": LONGER,
    "shape": ["model.num_layers=6"],
    "full": LONGER + ['checkpoint.save="/tmp/dlmspec-small/ckpt"', 'checkpoint.load="/tmp/dlmspec-small/ckpt"'],
    "badbin": ['data.train=[{prefix = ".device/checks/data/cut_text_document", weight = 1.0}]',
               'logging.run_dir=".device/runs/checks-badbin"', 'logging.tensorboard_dir=".device/runs/checks-badbin/tensorboard"',
               'checkpoint.save=".device/runs/checks-badbin/ckpt"'],
}


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    for name, overrides in VARIANTS.items():
        result = compile_spec(ROOT / "specs" / "demo-dlm.toml", OUT / name, overrides=COMMON + overrides)
        print(f"compiled {name} ({result.content_hash[:19]}) -> {(OUT / name).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
