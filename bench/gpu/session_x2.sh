#!/usr/bin/env bash
# The second GPU session (nvidia-h200-x2), from the repository root, after bench/gpu/prepare.py:
#   A. in parallel: GPU 0 trains the compiled demo, is stopped with SIGTERM after STOP_S seconds,
#      and is launched again (it must resume from the checkpoint saved on the signal);
#      GPU 1 runs one-GPU calibration directories.
#   B. two-GPU calibration directories (TP2+SP, PP2, EP2, DP2 with and without the distributed
#      optimizer).
#   C. the HF -> megatron-core conversion logit check at TP=1 and TP=2.
# Usage: bash bench/gpu/session_x2.sh OUT_DIR
set -u
out=${1:?usage: session_x2.sh OUT_DIR}
STOP_S=${STOP_S:-45}
mkdir -p "$out"
rm -rf runs/demo-dlm
(
  export CUDA_VISIBLE_DEVICES=0
  timeout -s TERM "$STOP_S" bash .device/demo/launch.sh > "$out/demo_launch1.log" 2>&1
  echo "launch1 exit $?" >> "$out/demo_launch1.log"
  cat runs/demo-dlm/exit_status.json >> "$out/demo_launch1.log" 2>&1
  cp runs/demo-dlm/metrics.jsonl "$out/demo_metrics_launch1.jsonl" 2>/dev/null
  bash .device/demo/launch.sh > "$out/demo_launch2.log" 2>&1
  echo "launch2 exit $?" >> "$out/demo_launch2.log"
  cp runs/demo-dlm/metrics.jsonl "$out/demo_metrics.jsonl"
  cp runs/demo-dlm/exit_status.json "$out/demo_exit_status.json"
  ls runs/demo-dlm/checkpoints >> "$out/demo_launch2.log" 2>&1
) &
demo=$!
CUDA_VISIBLE_DEVICES=1 bash bench/gpu/run_matrix.sh "$out/calibration_1gpu_b.json" 75 \
  .device/plan/demo-moe-e8-top2 .device/plan/demo-mdm-mb4-x8 .device/plan/demo-mdm-h1024 .device/plan/demo-mdm-mha
wait "$demo"
bash bench/gpu/run_matrix.sh "$out/calibration_2gpu.json" 90 \
  .device/plan/demo-tp2-sp .device/plan/demo-pp2 .device/plan/demo-moe-ep2 \
  .device/plan/demo-dp2-distopt .device/plan/demo-dp2-no-distopt
timeout 150 python3 bench/convert/verify_gpu.py --out "$out/convert_verify_gpu.json" > "$out/convert_verify.log" 2>&1
echo "convert exit $?" >> "$out/convert_verify.log"
