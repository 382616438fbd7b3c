#!/usr/bin/env bash
# Session 9 on one H200: one machine, held for back-to-back device calls (it goes back ~30 s after a
# call). The long jobs run in process sessions of their own (setsid), which outlive the call that
# started them, from a copy of the checkout in /tmp/s9/repo (later calls replace carried folders).
#
# CPU machine first (repository root):
#   .venv/bin/python bench/gpu/sft_prepare.py                # .data (demo + SFT sets), .device/sft-demo
#   .venv/bin/python bench/gpu/sft_answers.py prompts        # .data/sft/heldout_prompts.jsonl
#   rm -f .whl/dl/*.whl && .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl/dl .
#   cp ../shared/gpu/te-install.sh .device/te-install.sh
# Device calls, in order (carry in brackets):
#   STEP=start  [.whl/mc .whl/dl .data .device/sft-demo .device/te-install.sh]
#       installs megatron-core + dlmspec into /tmp/site; starts the generation job (gen_job below);
#   STEP=part N [.whl/te/core.part.0N]   (N = 0..5) copies one part of TE's core wheel to /tmp/te;
#   STEP=te     [.whl/te/small .whl/te/core.md5 .device/te .whl/mc19]
#       installs TE (../shared/gpu/te-install.sh), waits for the generation job's timed part, runs
#       bench/gpu/te_matrix.sh, and returns both jobs' results;
#   STEP=cal    [.device/tecal ...]  bench/gpu/te_calibration.sh (the TE planner calibration);
#   STEP=peers  [.whl/peer ...]      bench/gpu/peers.sh (TE against the strong HF loops).
# Each call writes into $OUT; at most 8 files come back, so every step packs one archive.
set -u
out=${1:?usage: STEP=start|part|te|cal|peers session9.sh OUT [N]}
s9=/tmp/s9
mkdir -p "$s9"
site() { export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1; }
gen_job() {  # #19's answers and #20's generation demo, in $s9/repo, results in $s9/gen
  cd "$s9/repo" || exit 1
  site
  local g=$s9/gen
  mkdir -p "$g/sft" "$g/gen"
  echo "gen_job start $(date -u +%T)"
  STAGE=base OUT=$g/sft PYTHON=python3 timeout 300 bash bench/gpu/sft_demo.sh > "$g/sft_base.log" 2>&1
  echo "base pre-training exit $? $(date -u +%T)"
  # the timed part (tokens/s) runs while nothing else is on the GPU; te_matrix waits for this marker
  OUT=$g/gen RUN=runs/bench-sft-demo/base/checkpoints PYTHON=python3 timeout 360 bash bench/gpu/generate_demo.sh \
    > "$g/gen.log" 2>&1
  echo "generate_demo exit $? $(date -u +%T)"
  touch "$s9/gen_timed.done"
  STAGE=sft OUT=$g/sft PYTHON=python3 timeout 300 bash bench/gpu/sft_demo.sh > "$g/sft.log" 2>&1
  echo "sft + evaluation exit $? $(date -u +%T)"
  for m in base sft; do
    timeout 120 python3 -m dlmspec.cli generate "runs/bench-sft-demo/$m" --prompts .data/sft/heldout_prompts.jsonl \
      --gen-length 64 --steps 64 --block-length 32 --batch-size 8 --json > "$g/sft/answers_$m.json" 2> "$g/sft/answers_$m.err"
    echo "generate $m exit $?"
  done
  python3 bench/gpu/sft_answers.py table "$g/sft/answers_base.json" "$g/sft/answers_sft.json" \
    .data/sft/heldout_prompts.jsonl "$g/sft/sft_answers_h200.json" > "$g/answers_table.log" 2>&1
  echo "answers table exit $? $(date -u +%T)"
  rm -rf runs/bench-sft-demo/sft/checkpoints
  touch "$s9/gen.done"
}
pack() {  # one archive of everything in $out
  ls -R "$out" | head -80
  tar czf "/tmp/session9_$1.tgz" -C "$out" . && rm -rf "${out:?}"/* && mv "/tmp/session9_$1.tgz" "$out/"
  ls -la "$out"
}
status() { echo "--- $(date -u +%T) gen job:"; cat "$s9/gen_job.log" 2>/dev/null; ls "$s9" 2>/dev/null | tr '\n' ' '; echo; }
case "${STEP:?}" in
  start)
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mc/*.whl .whl/dl/*.whl || exit 1
    rm -rf "$s9/repo" && mkdir -p "$s9/repo" && cp -a . "$s9/repo/" && rm -rf "$s9/repo/.whl"
    export -f gen_job site; export s9
    setsid bash -c gen_job > "$s9/gen_job.log" 2>&1 < /dev/null &
    sleep 20; status ;;
  part)
    n=${2:?part number}
    mkdir -p /tmp/te && cp ".whl/te/core.part.0$n" /tmp/te/ && ls -la /tmp/te; status ;;
  te)
    mkdir -p "$out/te" "$out/gen"
    t0=$(date +%s)
    bash .device/te-install.sh .whl/te/small > "$out/te_install.log" 2>&1
    echo "te-install exit $? after $(( $(date +%s) - t0 ))s"; tail -3 "$out/te_install.log"
    cp /tmp/te/out/transformer_engine_torch-*.whl "$out/" 2>/dev/null
    site; export PYTHONPATH=/tmp/site_te:$PYTHONPATH
    python3 -c "import transformer_engine.pytorch as te, transformer_engine; print('TE', transformer_engine.__version__)" 2>&1 | tail -1
    w=0; until [ -f "$s9/gen_timed.done" ] || [ $w -ge 240 ]; do sleep 5; w=$((w + 5)); done
    echo "waited ${w}s for the generation job's timed part"; status
    BUDGET_S=${BUDGET_S:-400} bash bench/gpu/te_matrix.sh "$out/te" > "$out/te_matrix.log" 2>&1
    echo "te_matrix exit $?"; tail -25 "$out/te_matrix.log"
    w=0; until [ -f "$s9/gen.done" ] || [ $w -ge 60 ]; do sleep 5; w=$((w + 5)); done
    status; cp -a "$s9/gen/." "$out/gen/"; cp "$s9/gen_job.log" "$out/gen/"
    rm -rf runs/te/*/checkpoints
    pack te ;;
  cal)
    site; export PYTHONPATH=/tmp/site_te:$PYTHONPATH
    [ -f "$s9/gen.done" ] || { status; cp -a "$s9/gen/." "$out/gen_late/" 2>/dev/null; }
    bash bench/gpu/te_calibration.sh "$out" > "$out/te_calibration.log" 2>&1; echo "te_calibration exit $?"
    tail -30 "$out/te_calibration.log"
    pack cal ;;
  peers)
    site; export PYTHONPATH=/tmp/site_te:$PYTHONPATH
    bash bench/gpu/peers.sh "$out" > "$out/peers.log" 2>&1; echo "peers exit $?"
    tail -30 "$out/peers.log"
    pack peers ;;
esac
