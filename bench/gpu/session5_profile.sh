#!/usr/bin/env bash
# Session 5, nvidia-h200-x2 (issue #4): where does the HOST's time go in the launch-bound runs the
# planner misses? torch.profiler over steps 20-23 on every rank (bench/gpu/prepare.py --profile
# 20:24), one run at a time (nothing else on the host), two-GPU runs next to their one-GPU twins:
# demo-moe-ep2 / demo-moe-e8-top2, demo-pp2 / demo-mdm-mb4-x8, demo-tp2-sp / demo-dp2-distopt /
# demo-mdm-b32-s512. Each rank's summary (backends/megatron/profiling.py) now has a "host" part:
# kernel launches, milliseconds waiting in CUDA synchronisations, active microseconds per launch.
# Prepare (CPU machine): .venv/bin/python bench/gpu/prepare.py --max-iters 40 --profile 20:24 NAME...
# Usage: bash bench/gpu/session5_profile.sh OUT_DIR [LIMIT_S]   (~7 minutes)
set -u
out=${1:?usage: OUT_DIR [LIMIT_S]}; limit=${2:-540}; work="$out/profile"; mkdir -p "$work"
deadline=$(( $(date +%s) + limit ))
NAMES=${NAMES:-"demo-moe-ep2 demo-moe-e8-top2 demo-pp2 demo-mdm-mb4-x8 demo-tp2-sp demo-mdm-b32-s512 demo-dp2-distopt"}
for name in $NAMES; do
  dir=".device/profile/$name-profile"
  DEADLINE=$deadline bash bench/gpu/run_matrix.sh "$work/$name.json" 110 "$dir" > "$work/$name.out" 2>&1
  for f in .device/runs/$name-profile/profile/summary_rank*.json; do
    [ -f "$f" ] && cp "$f" "$work/$name-$(basename "$f")"
  done
  echo "$name: $(tail -1 "$work/$name.out" | cut -c1-160)"
  grep -h "profile steps" "$work/$name.log" | cut -c1-400
done
