#!/usr/bin/env bash
# Session 3, first call on nvidia-h200-x2 (from the repository root, after
# `.venv/bin/python bench/gpu/prepare.py --profile 20:24 demo-pp2 demo-moe-ep2 demo-mdm-mb4-x8 demo-mdm-mha`
# and `.venv/bin/python bench/convert/init_from_gpu.py prepare`):
#   phase 1, two one-GPU lanes in parallel:
#     GPU 0 (issue #7): SDPA backends in megatron's layout; torch.profiler summaries of the
#           Qwen3-1.7B DLM at micro batch 10 (fused linear CE) with flash and with cuDNN attention;
#           the 50-step loss agreement of the fused linear CE against megatron's CE (micro batch 4,
#           real text, same seed).
#     GPU 1: fp32 resume after init_from (issue #6 leftover), then profiles of two one-GPU
#           calibration runs (issue #4).
#   phase 2, both GPUs: profiles of demo-pp2 and demo-moe-ep2 (issue #4's two misses).
# Everything lands in OUT_DIR/work and OUT_DIR/session3_profile.tgz.
# Usage: bash bench/gpu/session3_profile.sh OUT_DIR
set -u
out=${1:?usage: OUT_DIR}; work="$out/work"; mkdir -p "$work"
REF="python3 bench/runtime/train_reference.py --preset qwen3-1.7b"
nvidia-smi topo -m > "$work/topo.txt" 2>&1
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 60 python3 bench/throughput/sdpa_backends.py --layout sbhd --json "$work/sdpa_backends_sbhd.json"
  for attn in flash cudnn; do
    timeout 100 $REF --micro-batch-size 10 --train-iters 8 --log-interval 1 --cross-entropy fused_linear \
      --sdpa-backend "$attn" --profile-steps 5:7 --run-dir "/tmp/prof-$attn"
    cp "/tmp/prof-$attn/profile/summary_rank0.json" "$work/profile_qwen3_mb10_$attn.json"
    cp "/tmp/prof-$attn/metrics.jsonl" "$work/metrics_qwen3_mb10_$attn.jsonl"
  done
  for ce in megatron fused_linear; do
    timeout 110 $REF --micro-batch-size 4 --train-iters 50 --log-interval 1 --cross-entropy "$ce" \
      --data-prefix .data/pydocs-train_text_document --run-dir "/tmp/agree-$ce"
    cp "/tmp/agree-$ce/metrics.jsonl" "$work/agree_$ce.jsonl"
  done
  python3 bench/throughput/loss_agreement.py "$work/agree_megatron.jsonl" "$work/agree_fused_linear.jsonl" \
    --json "$work/loss_agreement_fused_ce.json"
) > "$work/lane0.log" 2>&1 &
lane0=$!
(
  export CUDA_VISIBLE_DEVICES=1
  OUT="$work" timeout 170 python3 bench/convert/init_from_gpu.py run --tp 1 > "$work/init_from_tp1.log" 2>&1
  bash bench/gpu/run_matrix.sh "$work/profile_1gpu.json" 80 .device/profile/demo-mdm-mb4-x8-profile \
    .device/profile/demo-mdm-mha-profile
) > "$work/lane1.log" 2>&1 &
lane1=$!
wait "$lane0" "$lane1"
tar czf "$out/session3_profile.tgz" -C "$out" work
bash bench/gpu/run_matrix.sh "$work/profile_2gpu.json" 90 .device/profile/demo-pp2-profile \
  .device/profile/demo-moe-ep2-profile > "$work/phase2.log" 2>&1
for d in .device/runs/*-profile; do
  mkdir -p "$work/$(basename "$d")"; cp "$d"/profile/summary_rank*.json "$d"/profile/trace_rank*.json.gz "$work/$(basename "$d")/" 2>/dev/null
done
tar czf "$out/session3_profile.tgz" -C "$out" work
