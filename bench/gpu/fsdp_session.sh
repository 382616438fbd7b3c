#!/usr/bin/env bash
# Megatron-FSDP (parallel.fsdp = "megatron", optim_grads_params) on two GPUs, from the repository
# root, after `.venv/bin/python bench/gpu/prepare_fsdp.py`:
#   1. the calibration entry demo-fsdp (peak memory and step time, bench/plan/calibrate.py's
#      format) to compare with `dlmspec plan`'s FSDP terms;
#   2. save and resume: .device/fsdp-resume trains 40 steps saving at 20 and 40; then `latest` is
#      pointed back at iter_0000020 and the same job is launched again: it must resume from step
#      20 (dlmspec.json says checkpoint_format fsdp_dtensor) and its losses at steps 25..40 must
#      match the uninterrupted run's (resume_summary.json).
# Usage: bash bench/gpu/fsdp_session.sh OUT_DIR     (a few minutes on two H200s; 8 files in OUT_DIR)
set -u
out=${1:?usage: fsdp_session.sh OUT_DIR}
LIMIT_S=${LIMIT_S:-150}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpus.txt" 2>&1
python3 -c 'import torch, megatron.core, einops; print("torch", torch.__version__, "megatron-core", megatron.core.__version__, "einops", einops.__version__)' >> "$out/gpus.txt" 2>&1

bash bench/gpu/run_matrix.sh "$out/calibration_fsdp.json" "$LIMIT_S" .device/plan/demo-fsdp

run=.device/runs/fsdp-resume
rm -rf "$run"
t0=$(date +%s)
timeout -s KILL "$LIMIT_S" bash .device/fsdp-resume/launch.sh > "$out/resume_run1.log" 2>&1
echo "run1 exit $? after $(( $(date +%s) - t0 ))s" | tee -a "$out/resume_run1.log"
ls "$run/ckpt" "$run/ckpt/iter_0000020" >> "$out/resume_run1.log" 2>&1
cat "$run/ckpt/iter_0000020/dlmspec.json" >> "$out/resume_run1.log" 2>&1
cp "$run/metrics.jsonl" "$out/resume_metrics_run1.jsonl" 2>/dev/null
echo iter_0000020 > "$run/ckpt/latest"
: > "$run/metrics.jsonl"
t0=$(date +%s)
timeout -s KILL "$LIMIT_S" bash .device/fsdp-resume/launch.sh > "$out/resume_run2.log" 2>&1
echo "run2 exit $? after $(( $(date +%s) - t0 ))s" | tee -a "$out/resume_run2.log"
cp "$run/metrics.jsonl" "$out/resume_metrics_run2.jsonl" 2>/dev/null
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def read(name):
    try:
        return [json.loads(l) for l in open(f"{out}/{name}")]
    except OSError:
        return []
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
