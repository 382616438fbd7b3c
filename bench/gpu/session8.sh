#!/usr/bin/env bash
# Session 8 on one H200, two device calls back to back (the second reuses the first's runs when the
# machine is still held, else re-trains the base model first).
# CPU machine first (repository root):
#   .venv/bin/python bench/gpu/sft_prepare.py                     # .data (demo + SFT sets), .device/sft-demo
#   .venv/bin/python bench/gpu/sft_answers.py prompts             # .data/sft/heldout_prompts.jsonl
#   bash bench/gpu/session7_resume.sh --compile /work/main/.device/s7 && cp bench/gpu/session7_resume.sh .device/
#   DLMSPEC_PYTHON=.venv/bin/python bash bench/gpu/viz_demo.sh --dry      # .device/viz-demo
#   rm -f .whl/dl/*.whl && .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl/dl .
# Device: PART=1 bash bench/gpu/session8.sh $OUT   (carry .whl/mc .whl/dl .data .device)
#         PART=2 bash bench/gpu/session8.sh $OUT   (carry .whl/mc .whl/dl .whl/wandb .data .device)
# PART=1: the SDPA first-call check (bench/gpu/sdpa_choice.py), exact resume (session7_resume.sh
#   PART=s8) in the background, and the SFT demo (sft_demo.sh) with the base and tuned models'
#   answers on held-out prompts (dlmspec generate). PART=2: generate_demo.sh on the SFT demo's base
#   run (its checkpoints at 100, 200, 300) and viz_demo.sh (W&B offline, plot).
set -u
out=${1:?usage: PART=1|2 session8.sh OUT}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mc/*.whl .whl/dl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
base=runs/bench-sft-demo/base
answers() {  # TIMEOUT_S: the base and the tuned SFT demo models' answers on held-out prompts, side by side
  for m in base sft; do
    timeout "$1" python3 -m dlmspec.cli generate "runs/bench-sft-demo/$m" --prompts .data/sft/heldout_prompts.jsonl \
      --gen-length 64 --steps 64 --block-length 32 --batch-size 8 --json > "$out/sft/answers_$m.json" 2> "$out/sft/answers_$m.err"
    echo "generate $m exit $?"
  done
  python3 bench/gpu/sft_answers.py table "$out/sft/answers_base.json" "$out/sft/answers_sft.json" \
    .data/sft/heldout_prompts.jsonl "$out/sft/sft_answers_h200.json" > /dev/null 2>&1; echo "answers table exit $?"
}
if [ "${PART:-1}" = 1 ]; then
  mkdir -p "$out/resume" "$out/sft"
  python3 bench/gpu/sdpa_choice.py > "$out/sdpa_choice.jsonl" 2> "$out/sdpa_choice.err"
  cat "$out/sdpa_choice.jsonl"
  (PART=s8 BUDGET_S=430 bash .device/session7_resume.sh "$out/resume" > "$out/resume.log" 2>&1) & pr=$!
  OUT=$out/sft PYTHON=python3 timeout 470 bash bench/gpu/sft_demo.sh > "$out/sft.log" 2>&1
  echo "sft_demo exit $?"; tail -5 "$out/sft.log"
  answers 60
  wait $pr; echo "resume exit $?"; tail -12 "$out/resume.log"
  rm -rf runs/bench-sft-demo/sft/checkpoints
elif [ "${PART}" = 2 ]; then
  # PART=1's SFT and answers failed (the start check refused the chat-token ids; `python3 -m
  # dlmspec.cli` from the checkout imported its dlmspec/ without backends): again on a fresh
  # machine with both fixed (PYTHONSAFEPATH keeps the checkout's folder off sys.path), then the
  # generation demo on the base run once it is trained, and the W&B demo beside it.
  export PYTHONSAFEPATH=1
  mkdir -p "$out/sft" "$out/gen" "$out/viz"
  (OUT=$out/sft PYTHON=python3 timeout 420 bash bench/gpu/sft_demo.sh > "$out/sft.log" 2>&1; echo "sft_demo exit $?" >> "$out/sft.log") & ps=$!
  until [ -f "$out/sft/base_metrics.jsonl" ] || ! kill -0 $ps 2>/dev/null; do sleep 2; done
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/wb .whl/wandb/*.whl
  (export PYTHONPATH=/tmp/site:/tmp/wb WANDB_DIR=/tmp/wandb; OUT=$out/viz timeout 240 bash bench/gpu/viz_demo.sh > "$out/viz.log" 2>&1; echo "viz exit $?" >> "$out/viz.log") & pv=$!
  (OUT=$out/gen RUN=$base/checkpoints PYTHON=python3 timeout 360 bash bench/sampling/generate_demo.sh > "$out/gen.log" 2>&1; echo "generate_demo exit $?" >> "$out/gen.log") & pg=$!
  wait $ps; tail -4 "$out/sft.log"
  answers 90
  wait $pg $pv; tail -3 "$out/gen.log"; tail -3 "$out/viz.log"
fi
ls -R "$out" | head -60
# at most 8 files come back: everything in one archive
tar czf /tmp/session8_part${PART:-1}.tgz -C "$out" . && rm -rf "${out:?}"/* && mv /tmp/session8_part${PART:-1}.tgz "$out/"
ls -la "$out"
