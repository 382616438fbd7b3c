#!/usr/bin/env bash
# Session 3, fourth call on nvidia-h200-x2, after `bench/gpu/prepare.py demo-cp2` and
# `bench/gpu/prepare_fsdp.py`:
#   phase 1, one GPU each (issue #7, gradient accumulation: 4 microbatches per optimizer step on
#            both sides): GPU 0 the runtime's best variant at micro batch 11; GPU 1 the HF baseline
#            at micro batch 6 (its best);
#   phase 2, both GPUs: DP2 at micro batch 10 with 4 microbatches per step (issue #7); the CP2
#            kernel check (bench/runtime/cp_attention_gpu.py) and the demo-cp2 calibration run
#            (issue #4); Megatron-FSDP calibration and save/resume (bench/gpu/fsdp_session.sh).
# Usage: bash bench/gpu/session3_final.sh OUT_DIR
set -u
out=${1:?usage: OUT_DIR}; work="$out/work"; mkdir -p "$work"
TP="python3 bench/throughput/run.py --out $work --timeout-s 150 --budget-s 300 --microbatches-per-step 4"
BEST="--megatron-arg=--cross-entropy=fused_linear --megatron-arg=--sdpa-backend=cudnn --megatron-arg=--rope-fusion"
CUDA_VISIBLE_DEVICES=0 $TP --sides megatron --megatron-micro-batch-sizes 11 --tag accum4-rope-cudnn $BEST \
  --work-dir /tmp/f0 > "$work/lane0.log" 2>&1 &
lane0=$!
CUDA_VISIBLE_DEVICES=1 $TP --sides hf --hf-micro-batch-sizes 6 --tag accum4-hf --work-dir /tmp/f1 > "$work/lane1.log" 2>&1
wait "$lane0"
tar czf "$out/session3_final.tgz" -C "$out" work
$TP --sides megatron --nproc 2 --megatron-micro-batch-sizes 10 --tag accum4-dp2-rope-cudnn $BEST --work-dir /tmp/f2 \
  > "$work/dp2.log" 2>&1
tar czf "$out/session3_final.tgz" -C "$out" work
timeout 120 python3 -m torch.distributed.run --standalone --nproc_per_node=2 bench/runtime/cp_attention_gpu.py \
  "$work/cp_attention_gpu.json" > "$work/cp_attention_gpu.log" 2>&1
bash bench/gpu/run_matrix.sh "$work/calibration_cp2.json" 100 .device/plan/demo-cp2 > "$work/cp2.log" 2>&1
tar czf "$out/session3_final.tgz" -C "$out" work
LIMIT_S=100 bash bench/gpu/fsdp_session.sh "$work/fsdp" > "$work/fsdp.log" 2>&1
rm -rf "$work"/megatron_* "$work"/hf_* 2>/dev/null
tar czf "$out/session3_final.tgz" -C "$out" work
