#!/usr/bin/env bash
# GPU sessions on nvidia-h200-x2, from the repository root, after bench/gpu/prepare.py --demo:
#   part a. in parallel: GPU 0 trains the compiled demo, is stopped with SIGTERM after STOP_S
#           seconds, and is launched again (it must resume from the checkpoint saved on the
#           signal); GPU 1 runs one-GPU calibration directories. Then the HF -> megatron-core
#           conversion logit check at TP=1 and TP=2.
#   part b. two-GPU calibration directories (TP2+SP, PP2, EP2, DP2 with and without the
#           distributed optimizer, Qwen3-1.7B TP2+SP).
# Usage: bash bench/gpu/session_x2.sh a|b OUT_DIR
# (Each part fits the device tool's 10-minute command limit; a run's own limit is LIMIT_S.)
set -u
part=${1:?usage: session_x2.sh a|b OUT_DIR}
out=${2:?usage: session_x2.sh a|b OUT_DIR}
STOP_S=${STOP_S:-50}
LIMIT_S=${LIMIT_S:-100}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpus.txt" 2>&1
if [ "$part" = a ]; then
  rm -rf runs/demo-dlm
  (
    export CUDA_VISIBLE_DEVICES=0
    t0=$(date +%s)
    timeout -s TERM "$STOP_S" bash .device/demo/launch.sh > "$out/demo_launch1.log" 2>&1
    echo "launch1 exit $? after $(( $(date +%s) - t0 ))s" >> "$out/demo_launch1.log"
    cat runs/demo-dlm/exit_status.json >> "$out/demo_launch1.log" 2>&1
    cp runs/demo-dlm/metrics.jsonl "$out/demo_metrics_launch1.jsonl" 2>/dev/null
    t0=$(date +%s)
    timeout -s KILL 300 bash .device/demo/launch.sh > "$out/demo_launch2.log" 2>&1
    echo "launch2 exit $? after $(( $(date +%s) - t0 ))s" >> "$out/demo_launch2.log"
    cp runs/demo-dlm/metrics.jsonl "$out/demo_metrics.jsonl"
    cat runs/demo-dlm/exit_status.json >> "$out/demo_launch2.log" 2>&1
    ls runs/demo-dlm/checkpoints >> "$out/demo_launch2.log" 2>&1
  ) &
  demo=$!
  CUDA_VISIBLE_DEVICES=1 bash bench/gpu/run_matrix.sh "$out/calibration_1gpu_c.json" "$LIMIT_S" \
    .device/plan/demo-mdm-gelu .device/plan/demo-mdm-dropout .device/plan/demo-mdm-b32-s512-varlen \
    .device/plan/qwen3-1.7b-ar-b4-s2048-full
  wait "$demo"
  timeout 150 python3 bench/convert/verify_gpu.py --out "$out/convert_verify_gpu.json" > "$out/convert_verify.log" 2>&1
  echo "convert exit $?" >> "$out/convert_verify.log"
else
  bash bench/gpu/run_matrix.sh "$out/calibration_2gpu.json" "$LIMIT_S" \
    .device/plan/demo-tp2-sp .device/plan/demo-pp2 .device/plan/demo-moe-ep2 \
    .device/plan/demo-dp2-distopt .device/plan/demo-dp2-no-distopt .device/plan/qwen3-1.7b-tp2-sp
fi
