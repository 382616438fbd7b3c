#!/usr/bin/env bash
# Megatron-FSDP (parallel.fsdp = "megatron", optim_grads_params) on two GPUs, from the repository
# root, after `.venv/bin/python bench/gpu/prepare_fsdp.py`:
#   1. the calibration entry demo-fsdp (peak memory and step time, bench/plan/calibrate.py's
#      format) to compare with `dlmspec plan`'s FSDP terms;
#   2. save and resume: .device/fsdp-resume trains 40 steps saving at 20 and 40; then `latest` is
#      pointed back at iter_0000020 and the same job is launched again: it must resume from step
#      20 (dlmspec.json says checkpoint_format fsdp_dtensor) and its losses at steps 25..40 must
#      match the uninterrupted run's (resume_summary.json).
# Usage: bash bench/devbox/gpu/fsdp_resume.sh OUT_DIR     (a few minutes on two H200s; 8 files in OUT_DIR)
# Each resume run is limited to LIMIT_S seconds (default 150): a run past it gets SIGTERM (torchrun
# forwards it to its workers), SIGKILL 15 s later, and a "KILLED by the timeout" line in its log.
set -u
out=${1:?usage: fsdp_session.sh OUT_DIR}
LIMIT_S=${LIMIT_S:-150}

# run_limited NAME LOG: launch .device/fsdp-resume under the time limit. Not `timeout -s KILL`:
# that kills only torchrun (launch.sh execs it), whose workers run in sessions of their own
# (start_new_session), so they outlived it, hung on with the agent's TCPStore gone ("recvValue
# failed ... Connection was likely closed" every second) next to the following run, and wrote
# over the log's exit line.
run_limited() {
  local name=$1 log=$2 t0 rc pids
  t0=$(date +%s)
  timeout -s TERM -k 15 "$LIMIT_S" bash .device/fsdp-resume/launch.sh > "$log" 2>&1
  rc=$?
  pids=$(pgrep -f "$PWD/.device/fsdp-resume/train.py" || true)
  if [ -n "$pids" ]; then
    echo "$name: workers still running after torchrun ended: $pids; killing them" | tee -a "$log"
    kill -KILL $pids 2>/dev/null
  fi
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "$name: KILLED by the ${LIMIT_S}s timeout (exit $rc after $(( $(date +%s) - t0 ))s): it hung or was too slow; see the last lines above" | tee -a "$log"
  else
    echo "$name exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$log"
  fi
}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpus.txt" 2>&1
python3 -c 'import torch, megatron.core, einops; print("torch", torch.__version__, "megatron-core", megatron.core.__version__, "einops", einops.__version__)' >> "$out/gpus.txt" 2>&1

[ -n "${SKIP_CALIBRATION:-}" ] || bash bench/devbox/gpu/run_matrix.sh "$out/calibration_fsdp.json" "$LIMIT_S" .device/plan/demo-fsdp

run=.device/runs/fsdp-resume
rm -rf "$run"
run_limited run1 "$out/resume_run1.log"
ls "$run/ckpt" "$run/ckpt/iter_0000020" >> "$out/resume_run1.log" 2>&1
cat "$run/ckpt/iter_0000020/dlmspec.json" >> "$out/resume_run1.log" 2>&1
cp "$run/metrics.jsonl" "$out/resume_metrics_run1.jsonl" 2>/dev/null
echo iter_0000020 > "$run/ckpt/latest"
: > "$run/metrics.jsonl"
run_limited run2 "$out/resume_run2.log"
cp "$run/metrics.jsonl" "$out/resume_metrics_run2.jsonl" 2>/dev/null
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)  # bench/: common.py read_metrics, the one metrics.jsonl reader
BENCH="$bench" python3 - "$out" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ["BENCH"])
from common import read_metrics
out = sys.argv[1]
def read(name):
    return read_metrics(f"{out}/{name}")
one, two = read("resume_metrics_run1.jsonl"), read("resume_metrics_run2.jsonl")
loss1 = {r["iteration"]: r["loss"] for r in one if r.get("event") == "train"}
loss2 = {r["iteration"]: r["loss"] for r in two if r.get("event") == "train"}
resume = [r for r in two if r.get("event") == "resume"]
common = sorted(set(loss1) & set(loss2))
diff = max((abs(loss1[i] - loss2[i]) for i in common), default=None)
summary = {"resumed_from": resume[0]["iteration"] if resume else None, "compared_iterations": common,
           "loss_run1": [loss1[i] for i in common], "loss_run2": [loss2[i] for i in common],
           "max_abs_loss_diff": diff}
json.dump(summary, open(f"{out}/resume_summary.json", "w"), indent=2)
print(json.dumps(summary))
PY
