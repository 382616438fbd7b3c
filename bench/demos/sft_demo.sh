#!/usr/bin/env bash
# one H200, from the repository root: pre-train the demo masked-diffusion LM
# (specs/demo-dlm.toml, its 300 iterations), fine-tune it with SFT (specs/demo-dlm-sft.toml, from
# the pre-trained checkpoints), then score both on the held-out conversations with the same fixed
# masks (bench/gpu/sft_eval.py): per-sample response loss with 95% confidence intervals.
#
# Inputs (made on the CPU machine, which sees ../shared; carry .data/ and .device/sft-demo/):
#   python bench/gpu/sft_prepare.py
# Then on the GPU machine:
#   OUT=/some/dir bash bench/demos/sft_demo.sh          # ~3-4 minutes on one H200
#   STAGE=base | STAGE=sft OUT=... bash bench/demos/sft_demo.sh   # only the pre-training | only SFT + evaluation
#   bash bench/demos/sft_demo.sh --dry                   # CPU: inputs, compiled files, masks; no training
# Writes $OUT/sft_demo_h200.json (the evaluation, with the commands) and the launch logs.
# Removes only its own run folder, runs/bench-sft-demo/, before it starts.
set -u
dry=0
[ "${1:-}" = "--dry" ] && dry=1
OUT=${OUT:-/tmp/sft_demo}
PY=${PYTHON:-python}
mkdir -p "$OUT"
dev=.device/sft-demo
runs=runs/bench-sft-demo
if [ ! -f "$dev/sft/train.py" ] || [ ! -f .data/demo-sft-heldout_text_document_response.idx ]; then
  if [ -d ../shared/data ]; then
    $PY bench/gpu/sft_prepare.py > "$OUT/prepare.log" 2>&1 || { cat "$OUT/prepare.log"; exit 1; }
  else
    echo "sft_demo.sh: $dev or .data/demo-sft-* missing: run python bench/gpu/sft_prepare.py on the machine with ../shared" >&2
    exit 2
  fi
fi
eval_cmd=("$PY" bench/gpu/sft_eval.py --train-py "$dev/sft/train.py" --data .data/demo-sft-heldout_text_document
          --base "$runs/base/checkpoints" --tuned "$runs/sft/checkpoints" --out "$OUT/sft_demo_h200.json"
          --draws 4 --max-samples 512 --seed 1234)
if [ "$dry" = 1 ]; then
  # what runs without CUDA: the compiled SFT train.py's start checks refuse only for the missing GPU
  $PY "$dev/sft/train.py" --check > "$OUT/check.log" 2>&1; echo "train.py --check exit $? (2 without a GPU)" >> "$OUT/check.log"
  "${eval_cmd[@]}" --dry --out "$OUT/sft_demo_dry.json"
  exit $?
fi
# STAGE=base: only the pre-training; STAGE=sft: only SFT and the evaluation (the base run kept);
# default: both.
stage=${STAGE:-all}
if [ "$stage" != sft ]; then
  rm -rf "$runs"
  t0=$(date +%s)
  bash "$dev/base/launch.sh" > "$OUT/base_launch.log" 2>&1; rc=$?
  echo "pre-training exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$OUT/base_launch.log"
  [ $rc = 0 ] || exit $rc
  cp "$runs/base/metrics.jsonl" "$OUT/base_metrics.jsonl" 2>/dev/null
  [ "$stage" = base ] && exit 0
fi
t0=$(date +%s)
bash "$dev/sft/launch.sh" > "$OUT/sft_launch.log" 2>&1; rc=$?
echo "SFT exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$OUT/sft_launch.log"
[ $rc = 0 ] || exit $rc
cp "$runs/sft/metrics.jsonl" "$OUT/sft_metrics.jsonl" 2>/dev/null
t0=$(date +%s)
"${eval_cmd[@]}" > "$OUT/eval.log" 2>&1; rc=$?
echo "evaluation exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$OUT/eval.log"
tail -n 40 "$OUT/eval.log"
exit $rc
