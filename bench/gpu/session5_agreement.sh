#!/usr/bin/env bash
# Session 5, nvidia-h200-x2 (issue #7): a 50-step loss check for each fused option ALONE,
# against one baseline with none of them: fused RoPE (--rope-fusion, [kernels] apply_rope_fusion),
# the fused QKV function (--qkv-fusion) and the compiled norms (--compiled-norm). The baseline is
# also rerun (the noise floor: the same command again). Qwen3-1.7B, micro batch 4, seq 4096,
# real text, seed 1234, fused linear cross entropy, cuDNN attention, 50 steps, loss every step.
#   GPU 0: base, rope, norm       GPU 1: base again, qkv
# Compare on the CPU: bench/throughput/loss_agreement.py base.jsonl OPT.jsonl --noise base_again.jsonl
# Usage: bash bench/gpu/session5_agreement.sh OUT_DIR        (~5 minutes)
set -u
out=${1:?usage: OUT_DIR}; work="$out/agree"; mkdir -p "$work"
REF="python3 bench/runtime/train_reference.py --preset qwen3-1.7b --micro-batch-size 4 --train-iters 50 --log-interval 1"
REF="$REF --cross-entropy fused_linear --sdpa-backend cudnn --data-prefix .data/pydocs-train_text_document"
lane() {  # GPU NAME:FLAGS...
  local gpu=$1; shift
  for item in "$@"; do
    local name=${item%%:*} flags=${item#*:}
    echo "=== $name ($flags) start $(date -u +%T)" >> "$work/lane$gpu.log"
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=$gpu timeout 170 $REF $flags --run-dir "/tmp/agree-$name" >> "$work/lane$gpu.log" 2>&1
    echo "=== $name exit $? end $(date -u +%T)" >> "$work/lane$gpu.log"
    cp "/tmp/agree-$name/metrics.jsonl" "$work/$name.jsonl" 2>/dev/null
  done
}
lane 0 "base:" "rope:--rope-fusion" "norm:--compiled-norm" &
lane 1 "base_again:" "qkv:--qkv-fusion"
wait
grep -h "^===" "$work"/lane*.log
