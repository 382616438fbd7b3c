#!/usr/bin/env bash
# Run compiled calibration directories on the GPU machine and summarise each run.
#
#   bash bench/devbox/gpu/run_matrix.sh OUT_JSON LIMIT_S DIR...
#
# Each DIR is a `dlmspec compile` output (from bench/gpu/prepare.py); its launch.sh runs from
# the repository root. The summary (bench/plan/calibrate.py's format) takes, from the run's
# metrics.jsonl, the largest peak_mem_gib (torch.cuda.max_memory_allocated, max over ranks),
# the median step_time_s of the intervals after iteration 10 (torch.compile warm-up) and the host's
# launch speed: host_launch_us, the mean of the run's host_launch events (the runtime measures it
# before and after the training loop, backends/megatron/hostbench.py; mean over ranks), and
# host_launch_us_phases, the value of each.
#
# DEADLINE (optional, epoch seconds): no run starts after DEADLINE - 20 s (it is recorded with
# "error": "not run: session deadline"), and each run's limit is cut to the time left.
# A run past its limit gets SIGTERM (torchrun forwards it to its workers), SIGKILL 15 s later;
# workers left behind are killed by pid (their command line names the directory's train.py).
set -u
out=${1:?usage: run_matrix.sh OUT_JSON LIMIT_S DIR...}; limit=${2:?}; shift 2
log="${out%.json}.log"
: > "$log"
summaries=()
for dir in "$@"; do
  name=$(basename "$dir")
  run_dir=".device/runs/$name"
  rm -rf "$run_dir"
  echo "=== $name" | tee -a "$log"
  t0=$(date +%s)
  run_limit=$limit
  if [ -n "${DEADLINE:-}" ]; then
    left=$(( DEADLINE - t0 ))
    if [ "$left" -lt 20 ]; then
      echo "=== $name: not run (session deadline)" | tee -a "$log"
      summaries+=("$name:deadline:$run_dir")
      continue
    fi
    [ "$left" -lt "$run_limit" ] && run_limit=$left
  fi
  timeout -s TERM -k 15 "$run_limit" bash "$dir/launch.sh" >> "$log" 2>&1
  rc=$?
  pids=$(pgrep -f "$PWD/$dir/train.py" || true)
  if [ -n "$pids" ]; then
    echo "=== $name: workers still running after torchrun ended: $pids; killing them" | tee -a "$log"
    kill -KILL $pids 2>/dev/null
  fi
  echo "=== $name: exit $rc after $(( $(date +%s) - t0 ))s (limit ${run_limit}s)" | tee -a "$log"
  summaries+=("$name:$rc:$run_dir")
done
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)  # bench/: common.py read_metrics, the one metrics.jsonl reader
BENCH="$bench" python3 - "$out" "${summaries[@]}" <<'PY'
import json, os, statistics, sys
sys.path.insert(0, os.environ["BENCH"])
import common
out, items = sys.argv[1], sys.argv[2:]
runs = []
for item in items:
    name, rc, run_dir = item.split(":", 2)
    if rc == "deadline":
        runs.append({"name": name, "error": "not run: session deadline"})
        continue
    run = {"name": name, "exit_code": int(rc)}
    records = common.read_metrics(f"{run_dir}/metrics.jsonl")
    if not records.found or records.refused:
        run["error"] = f"no metrics: {records.path}: {records.refused or 'no such file'}"
    train = [r for r in records if r.get("event") == "train" and r.get("step_time_s")]
    steady = [r for r in train if r["iteration"] > 10] or train[1:]
    host = [r for r in records if r.get("event") == "host_launch" and r.get("host_launch_us")]
    if host:
        run["host_launch_us"] = statistics.mean(r["host_launch_us"] for r in host)
        run["host_launch_us_phases"] = {r.get("phase", str(i)): r["host_launch_us"] for i, r in enumerate(host)}
        run["host_launch_us_max"] = max(r.get("host_launch_us_max", r["host_launch_us"]) for r in host)
    if steady:
        run["peak_allocated_bytes"] = int(max(r["peak_mem_gib"] for r in train) * 2**30)
        run["peak_reserved_bytes"] = int(max(r.get("peak_reserved_gib", 0) for r in train) * 2**30)
        run["step_seconds"] = statistics.median(r["step_time_s"] for r in steady)
        run["tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in steady)
        run["mfu"] = statistics.median(r["mfu"] for r in steady if r.get("mfu") is not None) if any(r.get("mfu") for r in steady) else None
        run["intervals"] = [r["iteration"] for r in steady]
        run["losses"] = [round(r["loss"], 4) for r in train]
    elif int(rc) != 0:
        run["error"] = f"exit code {rc} (see the log)"
    runs.append(run)
json.dump({"runs": runs}, open(out, "w"), indent=2)
print(json.dumps([{k: r.get(k) for k in ("name", "exit_code", "peak_allocated_bytes", "step_seconds", "host_launch_us")} for r in runs]))
PY
