#!/usr/bin/env bash
# Session 3, second call on nvidia-h200-x2: the Qwen3-1.7B lane of session3_profile.sh (whose
# first run called a shell function through `timeout` and did nothing), split over both GPUs,
# and the profile summaries of the first call's calibration runs (left on the machine).
#   GPU 0: SDPA backends in megatron's layout; profile at micro batch 10, flash attention;
#          50 steps with megatron's cross entropy (micro batch 4, real text).
#   GPU 1: profile at micro batch 10, cuDNN attention; the same 50 steps with the fused linear CE.
# Usage: bash bench/gpu/session3_qwen.sh OUT_DIR
set -u
out=${1:?usage: OUT_DIR}; work="$out/work"; mkdir -p "$work"
REF="python3 bench/runtime/train_reference.py --preset qwen3-1.7b"
lane() {  # GPU attention cross-entropy
  export CUDA_VISIBLE_DEVICES=$1
  timeout 100 $REF --micro-batch-size 10 --train-iters 8 --log-interval 1 --cross-entropy fused_linear \
    --sdpa-backend "$2" --profile-steps 5:7 --run-dir "/tmp/prof-$2"
  cp "/tmp/prof-$2/profile/summary_rank0.json" "$work/profile_qwen3_mb10_$2.json"
  cp "/tmp/prof-$2/metrics.jsonl" "$work/metrics_qwen3_mb10_$2.jsonl"
  timeout 120 $REF --micro-batch-size 4 --train-iters 50 --log-interval 1 --cross-entropy "$3" \
    --data-prefix .data/pydocs-train_text_document --run-dir "/tmp/agree-$3"
  cp "/tmp/agree-$3/metrics.jsonl" "$work/agree_$3.jsonl"
}
for d in .device/runs/*-profile; do
  mkdir -p "$work/$(basename "$d")"; cp "$d"/profile/summary_rank*.json "$work/$(basename "$d")/" 2>/dev/null
done
(CUDA_VISIBLE_DEVICES=0 timeout 60 python3 bench/throughput/sdpa_backends.py --layout sbhd \
   --json "$work/sdpa_backends_sbhd.json"; lane 0 flash megatron) > "$work/lane0.log" 2>&1 &
sleep 20; lane 1 cudnn fused_linear > "$work/lane1.log" 2>&1
wait
python3 bench/throughput/loss_agreement.py "$work/agree_megatron.jsonl" "$work/agree_fused_linear.jsonl" \
  --json "$work/loss_agreement_fused_ce.json" > "$work/loss_agreement.log" 2>&1
tar czf "$out/session3_qwen.tgz" -C "$out" work
