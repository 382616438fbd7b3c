#!/usr/bin/env bash
# Session 5, nvidia-h200-x2 (issue #4): are the planner's two-GPU misses (demo-moe-ep2 -26%,
# demo-tp2-sp -25%, demo-pp2 -22%, all planned too fast) the ranks' CPU placement? The ranks of
# these runs wait for each other inside the step (EP all-to-all + token-count syncs, TP
# collectives, PP p2p with batch_p2p_sync), so a step goes at the pace of the slower rank's host;
# bench/gpu/host_variance.py showed a launch-bound process running 25% faster bound to one core
# than left to the scheduler. Each configuration runs alternately unbound (as every calibration
# run so far) and bound: every rank to two cores of its own (16+2r, 17+2r: its main thread and
# NCCL's proxy thread) by a sitecustomize.py that reads LOCAL_RANK (torchrun's agent is left
# alone). The compiled directories are session 4's (.device/plan, bench/gpu/prepare.py).
# Usage: bash bench/gpu/session5_coupling.sh OUT_DIR [LIMIT_S]   (~8 minutes)
set -u
out=${1:?usage: OUT_DIR [LIMIT_S]}; limit=${2:-540}; work="$out/coupling"; mkdir -p "$work"
start=$(date +%s)
mkdir -p /tmp/pin
cat > /tmp/pin/sitecustomize.py <<'PY'
import os, sys
if os.environ.get("LOCAL_RANK") is not None:
    r = int(os.environ["LOCAL_RANK"])
    os.sched_setaffinity(0, {16 + 2 * r, 17 + 2 * r})
    print(f"[pin] local rank {r} bound to {sorted(os.sched_getaffinity(0))}", file=sys.stderr, flush=True)
PY
RUNS=${RUNS:-"demo-moe-ep2:free demo-moe-ep2:bound demo-pp2:free demo-pp2:bound demo-tp2-sp:free demo-tp2-sp:bound demo-moe-ep2:free demo-moe-ep2:bound"}
i=0
for item in $RUNS; do
  name=${item%%:*}; mode=${item#*:}; i=$((i + 1))
  deadline=$(( start + limit ))
  if [ $(( deadline - $(date +%s) )) -lt 75 ]; then echo "skip $i $name $mode (deadline)"; continue; fi
  if [ "$mode" = bound ]; then
    PYTHONPATH=/tmp/pin:$PYTHONPATH DEADLINE=$deadline bash bench/gpu/run_matrix.sh "$work/$i-$name-$mode.json" 110 ".device/plan/$name" > "$work/$i.out" 2>&1
  else
    DEADLINE=$deadline bash bench/gpu/run_matrix.sh "$work/$i-$name-$mode.json" 110 ".device/plan/$name" > "$work/$i.out" 2>&1
  fi
  echo "$i $name $mode: $(tail -1 "$work/$i.out" | cut -c1-200) [$(grep -c '^\[pin\]' "$work/$i-$name-$mode.log") pinned ranks]"
done
python3 - "$work" <<'PY'
import glob, json, os, sys
work = sys.argv[1]
runs = []
for f in sorted(glob.glob(f"{work}/*-*.json"), key=lambda p: int(os.path.basename(p).split("-")[0])):
    order, rest = os.path.basename(f)[:-5].split("-", 1)
    name, mode = rest.rsplit("-", 1)
    for r in json.load(open(f))["runs"]:
        r.update(order=int(order), binding=mode)
        runs.append(r)
json.dump({"runs": runs}, open(f"{work}/all.json", "w"), indent=1)
for r in runs:
    print(r["order"], r["name"], r["binding"], r.get("step_seconds"), r.get("host_launch_us"), r.get("error", ""))
PY
