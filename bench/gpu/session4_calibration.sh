#!/usr/bin/env bash
# Session 4 on nvidia-h200-x2 (issue #4): the WHOLE calibration matrix (bench/plan/matrix.json)
# in one call, so every configuration is measured in the same session, next to the host's
# kernel-launch speed (the runtime's host_launch events, backends/megatron/hostbench.py).
#
# Prepare on the CPU machine (writes .device/plan/NAME/, carried to the device):
#   .venv/bin/python bench/plan/matrix.py && .venv/bin/python bench/gpu/prepare.py --max-iters 40
# Run on the device, from the repository root, after the usual setup prefix:
#   bash bench/gpu/session4_calibration.sh "$OUT" [TOTAL_LIMIT_S]      (default 540 s)
# A subset: LANE0="names" LANE1="names" TWO="names" (space-separated matrix names), PHASE1_PERCENT
# (share of the limit for phase 1, default 50) and RESULT_NAME (the results file's name).
#
#   phase 1: the 19 one-GPU entries in two lanes side by side (CUDA_VISIBLE_DEVICES=0 and 1,
#            10 + 9 runs, the four Qwen3-1.7B runs split over them), until 50% of the limit;
#   phase 2: the 9 two-GPU entries, one after the other, until the limit (most informative first:
#            FSDP, DP2, PP2, EP2, CP2, TP2).
# Each run is at most 40 steps (the demo runs log every 5 steps: six steady intervals after
# iteration 10; the Qwen runs keep their 30) and at most PER_RUN_S (default 120 s); runs that the
# limit leaves no time for are recorded as "not run: session deadline" (bench/gpu/run_matrix.sh).
#
# Expected wall time: the runs are launch-bound demos dominated by start-up (imports, model
# build, torch.compile of the fused kernels: ~15-25 s) plus 40 steps of ~0.1 s (mb4-x8 ~0.5 s,
# Qwen ~0.3 s x 30): ~25 s a run. Phase 1: 9 runs per lane ~ 3.5-4 min; phase 2: 9 runs ~ 4 min;
# in all ~8 min (480 s) for 26 configurations, under the default 540 s limit.
#
# Writes into OUT_DIR:
#   bench/calibration/local/h200/matrix-host-launch-2026-11-30-a.json  every run (bench/plan/calibrate.py's format: name, peak,
#                                     step_seconds, host_launch_us, lane), with date (UTC, with
#                                     the time), device and commands; copy it to bench/results/
#                                     and run `.venv/bin/python bench/plan/calibrate.py --write`
#   session4.log                      one line per run (start, exit code, seconds), phase times
#   gpus.txt                          GPUs, driver, torch and megatron-core versions
#   work/lane0.log, lane1.log, two_gpu.log   the runs' console output; work/*.json per phase
set -u
out=${1:?usage: session4_calibration.sh OUT_DIR [TOTAL_LIMIT_S]}
total=${2:-540}
PER_RUN_S=${PER_RUN_S:-120}
work="$out/work"
mkdir -p "$work"
log="$out/session4.log"
start=$(date +%s)
echo "session4: start $(date -u +%FT%TZ), limit ${total}s" > "$log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpus.txt" 2>&1
python3 -c 'import torch, megatron.core; print("torch", torch.__version__, "megatron-core", megatron.core.__version__)' \
  >> "$out/gpus.txt" 2>&1

LANE0=${LANE0:-"qwen3-1.7b-mdm-b4-s2048 qwen3-1.7b-ar-b4-s2048-full demo-mdm-b32-s512 demo-mdm-b8-s2048
  demo-mdm-b4-s4096 demo-mdm-b32-s512-selective demo-mdm-b32-s512-full demo-mdm-b32-s512-varlen demo-ar-b32-s512
  demo-mdm-b32-s512-defaults"}
LANE1=${LANE1:-"qwen3-1.7b-mdm-b4-s2048-fusedce demo-mdm-mb4-x8 demo-mdm-h1024 demo-mdm-mha demo-mdm-gelu
  demo-mdm-dropout demo-moe-e8-top2 demo-mdm-b32-s512-fusedce qwen3-1.7b-mdm-b4-s2048-defaults"}
TWO=${TWO:-"demo-fsdp demo-dp2-distopt demo-pp2 demo-moe-ep2 demo-cp2 demo-dp2-no-distopt demo-tp2-sp demo-cp2-ar
  qwen3-1.7b-tp2-sp"}

dirs() {  # the compiled directories of the names given; a missing one is logged and left out
  local name
  for name in "$@"; do
    if [ -f ".device/plan/$name/launch.sh" ]; then
      echo ".device/plan/$name"
    else
      echo "session4: .device/plan/$name missing (run bench/gpu/prepare.py)" >> "$log"
    fi
  done
}

# Phase 1: two lanes of one-GPU runs.
phase1_end=$(( start + total * ${PHASE1_PERCENT:-50} / 100 ))
echo "phase 1 (one GPU, two lanes) until +$(( phase1_end - start ))s" >> "$log"
# shellcheck disable=SC2046,SC2086
CUDA_VISIBLE_DEVICES=0 DEADLINE=$phase1_end bash bench/gpu/run_matrix.sh "$work/lane0.json" "$PER_RUN_S" \
  $(dirs $LANE0) > "$work/lane0.out" 2>&1 &
lane0=$!
# shellcheck disable=SC2046,SC2086
CUDA_VISIBLE_DEVICES=1 DEADLINE=$phase1_end bash bench/gpu/run_matrix.sh "$work/lane1.json" "$PER_RUN_S" \
  $(dirs $LANE1) > "$work/lane1.out" 2>&1
wait "$lane0"
grep -h "^===" "$work/lane0.log" | sed 's/^/lane0 /' >> "$log"
grep -h "^===" "$work/lane1.log" | sed 's/^/lane1 /' >> "$log"
echo "phase 1 done at +$(( $(date +%s) - start ))s" >> "$log"

# Phase 2: two-GPU runs, until the limit.
# shellcheck disable=SC2046,SC2086
DEADLINE=$(( start + total )) bash bench/gpu/run_matrix.sh "$work/two_gpu.json" "$PER_RUN_S" \
  $(dirs $TWO) > "$work/two_gpu.out" 2>&1
grep -h "^===" "$work/two_gpu.log" | sed 's/^/two_gpu /' >> "$log"
echo "phase 2 done at +$(( $(date +%s) - start ))s" >> "$log"

python3 - "$out" "$work" "$start" <<'PY'
import datetime, json, os, sys
out, work, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = []
for lane, note in (("lane0", "one GPU, lane 0 (CUDA_VISIBLE_DEVICES=0), beside lane 1"),
                   ("lane1", "one GPU, lane 1 (CUDA_VISIBLE_DEVICES=1), beside lane 0"),
                   ("two_gpu", "two GPUs")):
    try:
        part = json.load(open(f"{work}/{lane}.json"))["runs"]
    except (OSError, ValueError, KeyError) as exc:
        part = [{"name": f"{lane}-missing", "error": f"no summary: {exc}"}]
    for run in part:
        run["lane"] = note
    runs.extend(part)
try:
    device = open(f"{out}/gpus.txt").read().strip().replace("\n", "; ")
except OSError:
    device = "unknown"
when = datetime.datetime.fromtimestamp(start, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
result = {
    "date": when,
    "device": "nvidia-h200-x2: " + device,
    "description": "Session 4: the whole bench/plan/matrix.json in one call (one-GPU runs two at a time, "
                   "then the two-GPU runs), at most 40 steps each, with the host's launch speed "
                   "(host_launch_us: the runtime's host_launch events, mean of start and end).",
    "commands": {
        "prepare (CPU machine)": ".venv/bin/python bench/plan/matrix.py && .venv/bin/python bench/gpu/prepare.py --max-iters 40",
        "device": "bash bench/gpu/session4_calibration.sh $OUT",
    },
    "runs": runs,
}
name = os.environ.get("RESULT_NAME", "bench/calibration/local/h200/matrix-host-launch-2026-11-30-a.json")
json.dump(result, open(f"{out}/{name}", "w"), indent=2)
ok = sum(1 for r in runs if "step_seconds" in r)
print(f"session4: {ok}/{len(runs)} runs measured; {out}/{name}")
for r in runs:
    print(f"  {r['name']:34s} step {r.get('step_seconds', float('nan')):8.4f} s  host {r.get('host_launch_us', float('nan')):6.2f} us  {r.get('error', '')}")
PY
echo "session4: end at +$(( $(date +%s) - start ))s" >> "$log"
