#!/usr/bin/env bash
# The demo's generation and ELBO on one GPU, from the repository root, after the demo pre-training (specs/demo-dlm.toml:
# checkpoints runs/demo-dlm/checkpoints/iter_0000100, _0000200, _0000300) and its data
# (.data/demo-valid_text_document, .data/gpt2): generation from prompts of the shared corpus, the
# ELBO of the early and late checkpoints with error bars, tokens/s at batch 1 and 32 for
# low-confidence and threshold decoding beside the peers' loop, and AR decoding at batch 1 and 32 with
# megatron-core's KV cache against full recompute (speed_ar.json: on RUN_AR, a trained demo-ar checkpoint,
# when given, else the demo-dlm checkpoint's weights run causally: demo-ar's shape, the same decode cost,
# no training) (bench/sampling/generate_demo.py).
# Writes JSON (each with the command that made it) to $OUT (default /tmp/generate_demo).
# About 3-4 minutes on an H200 (most of it is starting Python with torch + megatron-core 5 times; the
# AR timing runs inside the speed step's process, about 20 s more).
# Usage: bash bench/sampling/generate_demo.sh          (GPU)
#        bash bench/sampling/generate_demo.sh --dry    (CPU, a tiny run built on the spot; ~6 minutes on 2 busy cores)
set -euo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/generate_demo}
mkdir -p "$OUT"
here=$(dirname "$0")
if [ "${1:-}" = "--dry" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  $PY "$here/generate_demo.py" make-tiny --out "$work"
  RUN=$work/run/checkpoints; DATA=$work/data/valid; DEV=cpu
  GEN=(--gen-length 16 --steps 16 --block-length 8); EVAL=(--seq-length 16 --num-sequences 4 --num-samples 4 --samples-per-forward 4 --batch-size 2)
  SPEED=(--gen-length 16 --steps 16 --block-length 8 --batches 1,4); TOK=()
  PROMPT=(--tokens 8 --n 4)
else
  RUN=${RUN:-runs/demo-dlm/checkpoints}; DATA=${DATA:-.data/demo-valid}; DEV=${DEVICE:-cuda}
  GEN=(--gen-length 128 --steps 128 --block-length 32); EVAL=(--seq-length 512 --num-sequences 32 --num-samples 64 --samples-per-forward 8 --batch-size 4)
  SPEED=(--gen-length 128 --steps 128 --block-length 32 --batches 1,32); TOK=(--vocab-file .data/gpt2/vocab.json --merge-file .data/gpt2/merges.txt)
  PROMPT=(--tokens 32 --n 8)
fi
t0=$(date +%s)
: > "$OUT/commands.txt"
cmd() { echo "$*" >> "$OUT/commands.txt"; "$@"; }  # the CLI's JSON envelopes hold no command: commands.txt does
$PY "$here/generate_demo.py" prompts --data "$DATA" "${PROMPT[@]}" "${TOK[@]}" --out "$OUT/prompts.jsonl"
# 1. text from the late checkpoint (both decoding rules); the envelope records every setting
for rule in low_confidence threshold; do
  cmd $PY -m dlmspec.cli generate "$RUN/iter_0000300" --prompts "$OUT/prompts.jsonl" --remasking "$rule" "${GEN[@]}" \
    --device "$DEV" --json > "$OUT/generate_iter300_$rule.json"
done
# 2. the ELBO bound of an early, a middle and the late checkpoint (both estimators, the same windows and seed)
for it in 0000100 0000200 0000300; do
  cmd $PY -m dlmspec.cli eval "$RUN/iter_$it" --data "$DATA" --estimator both "${EVAL[@]}" --device "$DEV" --json \
    > "$OUT/eval_iter$it.json"
done
$PY "$here/generate_demo.py" summary "$OUT"/eval_iter*.json --out "$OUT/elbo_summary.json"
# 3. tokens/s: dlmspec's sampler on megatron-core beside the peers' loop on the converted HF model; then AR
#    decoding, KV cache on / off (speed_ar.json)
$PY "$here/generate_demo.py" speed --ckpt "$RUN/iter_0000300" --prompts "$OUT/prompts.jsonl" "${SPEED[@]}" \
  --device "$DEV" --out "$OUT/speed.json" --ar-out "$OUT/speed_ar.json" ${RUN_AR:+--ar-ckpt "$RUN_AR"}
echo "generate_demo: done in $(( $(date +%s) - t0 ))s; results in $OUT"
