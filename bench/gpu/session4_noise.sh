#!/usr/bin/env bash
# Session 4, second call on nvidia-h200-x2 (issue #7): the noise floor of the 50-step loss
# agreement. The same 50 steps as session4_throughput.sh's loss check (Qwen3-1.7B, micro batch 4,
# real text, seed 1234, fused linear CE, cuDNN attention, fused RoPE), without the new options:
#   GPU 0: the same command again (what run-to-run non-determinism alone gives);
#   GPU 1: with flash attention instead of cuDNN (the same arithmetic, other rounding).
# Both are compared with the first call's agree_before.jsonl on the CPU afterwards.
# About 2 minutes. Usage: bash bench/gpu/session4_noise.sh OUT_DIR
set -u
out=${1:?usage: OUT_DIR}; work="$out/work"; mkdir -p "$work"
REF="python3 bench/runtime/train_reference.py --preset qwen3-1.7b --micro-batch-size 4 --train-iters 50 --log-interval 1"
REF="$REF --cross-entropy fused_linear --rope-fusion --data-prefix .data/pydocs-train_text_document"
CUDA_VISIBLE_DEVICES=0 timeout 150 $REF --sdpa-backend cudnn --run-dir /tmp/noise-repeat > "$work/repeat.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 150 $REF --sdpa-backend flash --run-dir /tmp/noise-flash > "$work/flash.log" 2>&1
wait
cp /tmp/noise-repeat/metrics.jsonl "$work/agree_before_repeat.jsonl"
cp /tmp/noise-flash/metrics.jsonl "$work/agree_before_flash.jsonl"
tail -3 "$work/repeat.log" "$work/flash.log"
