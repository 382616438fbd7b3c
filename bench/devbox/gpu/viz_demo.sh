#!/usr/bin/env bash
# one H200: the demo (specs/demo-dlm.toml) for 60 steps with W&B offline,
# to show the console line (progress, tokens seen, ETA; the timed start phases; the provenance line)
# and the W&B offline run files. Copies to $OUT: the console log, metrics.jsonl, the offline run
# folder, a `dlmspec plot` PNG, and viz_demo.json (the commands, exit codes, seconds, and the W&B
# run read back with wandb's own record type compared with metrics.jsonl).
#
# Prepare (CPU machine, repository root):
#   .venv/bin/python bench/gpu/prepare.py --demo          # .data/: the demo's tokenizer and corpus
#   python3 -m pip download --python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl/wandb wandb==0.31.0
#                                                          # 37 wheels, 27 MB (wandb and what it imports)
#   bash bench/devbox/gpu/viz_demo.sh --dry                       # compiles .device/viz-demo, checks the script
# Device (carry .data .device .whl/wandb, plus the wrapper's megatron-core/dlmspec):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/wb .whl/wandb/*.whl \
#     && export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/wb && bash bench/devbox/gpu/viz_demo.sh
# About 1-2 minutes on an H200 (start-up ~30-60 s, 60 steps at ~0.09 s, two evaluations, one save).
# The PNG needs matplotlib on the device (39 MB more of wheels); without it the script says so and
# `dlmspec plot OUT/run -o OUT/viz_demo_plot.png` draws it here from the copied metrics.jsonl.
set -u
DRY=0
[ "${1:-}" = "--dry" ] && DRY=1
OUT=${OUT:-/tmp/viz_demo}
PY=${DLMSPEC_PYTHON:-python3}
NAME=viz-demo
COMPILED=.device/$NAME
RUN=runs/$NAME
mkdir -p "$OUT"
compile_cmd=("$PY" -m dlmspec.cli compile specs/demo-dlm.toml -o "$COMPILED" --force
  --set "name='$NAME'" --set train.train_iters=60 --set train.lr_warmup_iters=10 --set train.eval_interval=20
  --set train.eval_iters=5 --set checkpoint.save_interval=30 --set logging.log_interval=5
  --set "logging.wandb_project='dlmspec-viz'" --set "logging.wandb_mode='offline'"
  --set "logging.wandb_tags=['h200', 'viz-demo']")
launch_cmd=(timeout -s TERM 150 bash "$COMPILED/launch.sh")
plot_cmd=("$PY" -m dlmspec.cli plot "$OUT/run" -o "$OUT/viz_demo_plot.png" --force)

t0=$(date +%s)
if [ ! -f "$COMPILED/train.py" ] || [ "$DRY" = 1 ]; then
  "${compile_cmd[@]}" > "$OUT/viz_demo_compile.log" 2>&1
  compile_rc=$?
else
  compile_rc=skipped   # compiled on the CPU machine (--dry)
fi
launch_rc=dry
plot_rc=dry
if [ "$DRY" = 0 ]; then
  # wandb's own settings and cache out of $HOME (offline: no key, no network)
  export WANDB_CONFIG_DIR=${WANDB_CONFIG_DIR:-/tmp/viz-wandb/config} WANDB_CACHE_DIR=${WANDB_CACHE_DIR:-/tmp/viz-wandb/cache}
  rm -rf "$RUN"        # a fresh run: one W&B run, one launch in metrics.jsonl
  "${launch_cmd[@]}" > "$OUT/viz_demo_console.log" 2>&1
  launch_rc=$?
  mkdir -p "$OUT/run"
  cp "$RUN/metrics.jsonl" "$RUN/exit_status.json" "$OUT/run/" 2>/dev/null
  mkdir -p "$OUT/wandb"
  cp -r "$RUN"/wandb/wandb/offline-run-* "$OUT/wandb/" 2>/dev/null
  cp "$RUN/wandb/dlmspec-wandb-id" "$OUT/wandb/" 2>/dev/null
  "${plot_cmd[@]}" > "$OUT/viz_demo_plot.log" 2>&1
  plot_rc=$?
fi
seconds=$(( $(date +%s) - t0 ))

bench=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)  # bench/: common.py read_metrics, the one metrics.jsonl reader
BENCH="$bench" OUT="$OUT" DRY="$DRY" COMPILE_RC="$compile_rc" LAUNCH_RC="$launch_rc" PLOT_RC="$plot_rc" SECONDS_ALL="$seconds" \
COMPILE_CMD="${compile_cmd[*]}" LAUNCH_CMD="${launch_cmd[*]}" PLOT_CMD="${plot_cmd[*]}" "$PY" - <<'PY'
"""viz_demo.json: what ran, and the W&B offline run compared with metrics.jsonl."""
import glob
import json
import os
import sys

sys.path.insert(0, os.environ["BENCH"])
import common

out = os.environ["OUT"]
result = {
    "benchmark": "the demo for 60 steps with W&B offline (console line, offline run files, plot)",
    "dry": os.environ["DRY"] == "1",
    "commands": {"compile": os.environ["COMPILE_CMD"], "launch": os.environ["LAUNCH_CMD"],
                 "plot": os.environ["PLOT_CMD"], "script": "bash bench/devbox/gpu/viz_demo.sh"},
    "exit_codes": {"compile": os.environ["COMPILE_RC"], "launch": os.environ["LAUNCH_RC"],
                   "plot": os.environ["PLOT_RC"]},
    "seconds": int(os.environ["SECONDS_ALL"]),
}
try:
    import torch
    result["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
except Exception as exc:  # the summary is written whatever is missing
    result["device"] = f"unknown ({exc})"
console = os.path.join(out, "viz_demo_console.log")
if os.path.exists(console):
    lines = open(console, errors="replace").read().splitlines()
    result["console_train_lines"] = [l for l in lines if l.startswith("iter ") and "ETA" in l][-3:]
    result["console_dlmspec_lines"] = [l for l in lines if l.startswith("[dlmspec]")][:12]
records = common.read_metrics(os.path.join(out, "run", "metrics.jsonl"))
train = [r for r in records if r.get("event") == "train"]
start = next((r for r in records if r.get("event") == "start"), {})
result["provenance"] = start.get("provenance")
result["phases_s"] = start.get("phases_s")
result["last_train"] = train[-1] if train else None
run_files = sorted(glob.glob(os.path.join(out, "wandb", "offline-run-*", "run-*.wandb")))
result["wandb_run_files"] = [os.path.relpath(p, out) for p in run_files]
if run_files and train:
    try:
        from dlmspec.backends.megatron.wandb_log import read_offline_run
        found = read_offline_run(run_files[-1])
        by_step = {}
        for row in found["history"]:
            by_step.setdefault(row.get("_step"), {}).update(row)
        keys = ("loss", "lr", "tokens_per_s", "eta_s", "mask_ratio")
        diffs, missing = [], []
        for r in train:
            row = by_step.get(r["iteration"], {})
            for k in keys:
                if r.get(k) is None:
                    continue
                if f"train/{k}" not in row:
                    missing.append([r["iteration"], k])
                else:
                    diffs.append(abs(row[f"train/{k}"] - r[k]) / max(abs(r[k]), 1e-12))
        result["wandb_vs_metrics"] = {"run_id": found["run_id"], "project": found["project"],
                                      "train_records": len(train), "values_compared": len(diffs),
                                      "max_rel_diff": max(diffs) if diffs else None, "missing": missing[:10]}
    except Exception as exc:
        result["wandb_vs_metrics"] = {"error": repr(exc)}
with open(os.path.join(out, "viz_demo.json"), "w") as f:
    json.dump(result, f, indent=1)
print(json.dumps({k: result[k] for k in ("dry", "exit_codes", "seconds")}))
PY
