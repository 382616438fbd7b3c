#!/usr/bin/env bash
# Session 3, third call on nvidia-h200-x2 (issue #7), after the profile of session3_qwen.sh showed
# RoPE's unfused element-wise kernels (~100 ms of a 1.19 s step) and cuDNN attention ahead of flash
# in the model (305 against 409 ms):
#   GPU 0: the runtime with fused RoPE + fused linear CE + cuDNN attention at micro batch 10 and 11,
#          then the same with flash attention at 10 (A/B);
#   GPU 1: the Hugging Face baseline at micro batch 4 and 6 (same session), then a profile of the
#          fused-RoPE run at micro batch 10 (kernel counts for the planner);
#   both:  DP2 of the fused-RoPE cuDNN variant at micro batch 10.
# Usage: bash bench/gpu/session3_throughput.sh OUT_DIR
set -u
out=${1:?usage: OUT_DIR}; work="$out/work"; mkdir -p "$work"
TP="python3 bench/throughput/run.py --out $work --timeout-s 150 --budget-s 420"
BEST="--megatron-arg=--cross-entropy=fused_linear --megatron-arg=--sdpa-backend=cudnn --megatron-arg=--rope-fusion"
(
  export CUDA_VISIBLE_DEVICES=0
  $TP --sides megatron --megatron-micro-batch-sizes 10,11 --tag rope-cudnn $BEST --work-dir /tmp/tp0
  $TP --sides megatron --megatron-micro-batch-sizes 10 --tag rope-flash --work-dir /tmp/tp0b \
    --megatron-arg=--cross-entropy=fused_linear --megatron-arg=--sdpa-backend=flash --megatron-arg=--rope-fusion
) > "$work/lane0.log" 2>&1 &
lane0=$!
(
  export CUDA_VISIBLE_DEVICES=1
  $TP --sides hf --hf-micro-batch-sizes 4,6 --tag hf --work-dir /tmp/tp1
  timeout 100 python3 bench/runtime/train_reference.py --preset qwen3-1.7b --micro-batch-size 10 --train-iters 8 \
    --log-interval 1 --cross-entropy fused_linear --sdpa-backend cudnn --rope-fusion --profile-steps 5:7 --run-dir /tmp/prof-rope
  cp /tmp/prof-rope/profile/summary_rank0.json "$work/profile_qwen3_mb10_cudnn_rope.json"
  cp /tmp/prof-rope/metrics.jsonl "$work/metrics_qwen3_mb10_cudnn_rope.jsonl"
) > "$work/lane1.log" 2>&1 &
lane1=$!
wait "$lane0" "$lane1"
tar czf "$out/session3_throughput.tgz" -C "$out" work
$TP --sides megatron --nproc 2 --megatron-micro-batch-sizes 10 --tag dp2-rope-cudnn $BEST --work-dir /tmp/tpdp > "$work/dp2.log" 2>&1
rm -rf "$work"/*/ 2>/dev/null
tar czf "$out/session3_throughput.tgz" -C "$out" work
