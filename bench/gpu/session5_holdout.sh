#!/usr/bin/env bash
# Session 5, nvidia-h200-x2 (issue #4): the holdout configurations (bench/plan/holdout.json), one
# at a time, AFTER their predictions were committed (bench/results/holdout_predictions.json).
# Prepare (CPU machine): .venv/bin/python bench/gpu/prepare.py --matrix bench/plan/holdout.json --max-iters 40
# Usage: bash bench/gpu/session5_holdout.sh OUT_DIR [LIMIT_S]      (~4 minutes)
# Then: .venv/bin/python bench/plan/holdout.py compare bench/results/holdout_predictions.json OUT_DIR/holdout.json OUT
set -u
out=${1:?usage: OUT_DIR [LIMIT_S]}; limit=${2:-330}
DEADLINE=$(( $(date +%s) + limit )) bash bench/gpu/run_matrix.sh "$out/holdout.json" 150 \
  .device/plan/holdout-qwen3-1.7b-mdm-b2-s4096-selective .device/plan/holdout-demo-ar-b16-s1024 \
  .device/plan/holdout-qwen3-1.7b-mdm-dp2-b4-s2048 > "$out/holdout.out" 2>&1
tail -1 "$out/holdout.out"
grep -h "^===" "$out/holdout.log"
