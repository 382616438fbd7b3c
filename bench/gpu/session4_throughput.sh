#!/usr/bin/env bash
# Session 4, first call on nvidia-h200-x2 (issue #7): the fused QKV path and the compiled norms
# (train_reference.py --qkv-fusion --compiled-norm; [kernels] qkv_fusion / compiled_norm).
#   GPU 0: a profile at micro batch 10 (kernel time per category against session 3's
#          profile_h200x2_2026-11-30.json), then the runtime at micro batch 11 and 12, 4
#          microbatches per optimizer step;
#   GPU 1: the Hugging Face baseline at micro batch 6 (its best), 4 microbatches per step, then
#          50 steps at micro batch 4 on real text without and with the two options (same seed)
#          and bench/throughput/loss_agreement.py;
#   both:  DP2 at micro batch 11, 4 microbatches per step.
# About 8 minutes. Usage: bash bench/gpu/session4_throughput.sh OUT_DIR
set -u
out=${1:?usage: OUT_DIR}; work="$out/work"; mkdir -p "$work"
REF="python3 bench/runtime/train_reference.py --preset qwen3-1.7b"
BEST="--cross-entropy fused_linear --sdpa-backend cudnn --rope-fusion"
NEW="--qkv-fusion --compiled-norm"
TP="python3 bench/throughput/run.py --out $work --timeout-s 150 --budget-s 330 --microbatches-per-step 4"
TP_NEW="--megatron-arg=--cross-entropy=fused_linear --megatron-arg=--sdpa-backend=cudnn --megatron-arg=--rope-fusion --megatron-arg=--qkv-fusion --megatron-arg=--compiled-norm"
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 120 $REF --micro-batch-size 10 --train-iters 8 --log-interval 1 $BEST $NEW --profile-steps 5:7 \
    --run-dir /tmp/prof-new
  cp /tmp/prof-new/profile/summary_rank0.json "$work/profile_qwen3_mb10_qkv_norm.json"
  cp /tmp/prof-new/metrics.jsonl "$work/metrics_qwen3_mb10_qkv_norm.jsonl"
  $TP --sides megatron --megatron-micro-batch-sizes 11,12 --tag accum4-qkv-norm $TP_NEW --work-dir /tmp/t0
) > "$work/lane0.log" 2>&1 &
lane0=$!
(
  export CUDA_VISIBLE_DEVICES=1
  $TP --sides hf --hf-micro-batch-sizes 6 --tag accum4-hf --work-dir /tmp/t1
  for variant in before after; do
    extra=""; [ "$variant" = after ] && extra="$NEW"
    timeout 120 $REF --micro-batch-size 4 --train-iters 50 --log-interval 1 $BEST $extra \
      --data-prefix .data/pydocs-train_text_document --run-dir "/tmp/agree-$variant"
    cp "/tmp/agree-$variant/metrics.jsonl" "$work/agree_$variant.jsonl"
  done
  python3 bench/throughput/loss_agreement.py "$work/agree_before.jsonl" "$work/agree_after.jsonl" \
    --json "$work/loss_agreement_qkv_norm.json"
) > "$work/lane1.log" 2>&1 &
lane1=$!
wait "$lane0" "$lane1"
tar czf "$out/session4_throughput.tgz" -C "$out" work
$TP --sides megatron --nproc 2 --megatron-micro-batch-sizes 11 --tag accum4-dp2-qkv-norm $TP_NEW --work-dir /tmp/t2 \
  > "$work/dp2.log" 2>&1
rm -rf "$work"/megatron_* "$work"/hf_* 2>/dev/null
tar czf "$out/session4_throughput.tgz" -C "$out" work
