#!/usr/bin/env bash
# Session 9 on one H200: one machine, held for back-to-back device calls (it goes back ~30 s after a
# call). The long jobs run in process sessions of their own (setsid), which outlive the call that
# started them, from copies of the checkout under /tmp/s9 (later calls replace carried folders);
# the calls in between only report progress and bring back what has finished.
#
# CPU machine first (repository root):
#   .venv/bin/python bench/gpu/sft_prepare.py                # .data (demo + SFT sets), .device/sft-demo
#   .venv/bin/python bench/gpu/sft_answers.py prompts        # .data/sft/heldout_prompts.jsonl
#   bash bench/gpu/te_matrix.sh --dry                        # .device/te
#   bash bench/gpu/te_calibration.sh --dry                   # .device/tecal
#   rm -f .whl/dl/*.whl && .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl/dl .
#   cp ../shared/gpu/te-install.sh .device/te-install.sh
# Device calls, in order (carry in brackets):
#   STEP=start  [.whl/mc .whl/dl .data .device/sft-demo .device/te-install.sh]
#       installs megatron-core + dlmspec into /tmp/site; starts the generation job (gen_job);
#   STEP=part N [.whl/te/core.part.0N]   (N = 0..5) copies one part of TE's core wheel to /tmp/te;
#   STEP=te     [.whl/te/small .whl/te/core.md5 .device/te .device/tecal .device/te-install.sh .whl/mc19 .whl/peer]
#       installs TE (../shared/gpu/te-install.sh) and starts the TE job (te_job): once the generation
#       job's timed part is done, bench/gpu/te_matrix.sh; once the generation job is done (the GPU
#       alone), bench/gpu/te_calibration.sh, then bench/gpu/peers.sh;
#   STEP=poll S  waits up to S seconds (or until everything is done) and brings back what finished.
# At most 8 files come back from a call, so each call packs one archive.
# Keep the calls back to back: a machine left idle for 30 s goes back with every job on it (session
# 9 lost the calibration and the peers that way); prepare any change before the previous call returns.
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
  OUT=$g/gen RUN=runs/bench-sft-demo/base/checkpoints PYTHON=python3 timeout 360 bash bench/sampling/generate_demo.sh \
    > "$g/gen.log" 2>&1
  echo "generate_demo exit $? $(date -u +%T)"
  touch "$s9/gen_timed.done"
  STAGE=sft OUT=$g/sft PYTHON=python3 timeout 300 bash bench/gpu/sft_demo.sh > "$g/sft.log" 2>&1
  echo "sft + evaluation exit $? $(date -u +%T)"
  for m in base sft; do
    # the base model has no embeddings for the chat tokens' ids: it reads the prompts as text
    p=.data/sft/heldout_prompts.jsonl; [ $m = base ] && p=.data/sft/heldout_prompts_base.jsonl
    timeout 120 python3 -m dlmspec.cli generate "runs/bench-sft-demo/$m" --prompts $p \
      --gen-length 64 --steps 64 --block-length 32 --batch-size 8 --json > "$g/sft/answers_$m.json" 2> "$g/sft/answers_$m.err"
    echo "generate $m exit $?"
  done
  python3 bench/gpu/sft_answers.py table "$g/sft/answers_base.json" "$g/sft/answers_sft.json" \
    .data/sft/heldout_prompts.jsonl "$g/sft/sft_answers_h200.json" > "$g/answers_table.log" 2>&1
  echo "answers table exit $? $(date -u +%T)"
  rm -rf runs/bench-sft-demo/sft/checkpoints
  touch "$s9/gen.done"
}
te_job() {  # TE correctness, then (GPU alone) calibration and the peers; results in $s9/res/<job>
  cd "$s9/repo2" || exit 1
  site; export PYTHONPATH=/tmp/site_te:$PYTHONPATH
  mkdir -p "$s9/res/te" "$s9/res/cal" "$s9/res/peers"
  w=0; until [ -f "$s9/gen_timed.done" ] || [ $w -ge 300 ]; do sleep 5; w=$((w + 5)); done
  echo "te_job: waited ${w}s for the generation job's timed part $(date -u +%T)"
  LANES=${TE_LANES:-5} BUDGET_S=${TE_BUDGET_S:-450} bash bench/gpu/te_matrix.sh "$s9/res/te" > "$s9/res/te.log" 2>&1
  echo "te_matrix exit $? $(date -u +%T)"; touch "$s9/te.done"
  rm -rf runs/te
  w=0; until [ -f "$s9/gen.done" ] || [ $w -ge 120 ]; do sleep 5; w=$((w + 5)); done
  echo "te_job: waited ${w}s for the generation job $(date -u +%T)"
  BUDGET_S=${CAL_BUDGET_S:-390} bash bench/gpu/te_calibration.sh "$s9/res/cal" > "$s9/res/cal.log" 2>&1
  echo "te_calibration exit $? $(date -u +%T)"; touch "$s9/cal.done"
  WHL=.whl/peer BUDGET_S=${PEERS_BUDGET_S:-400} bash bench/gpu/peers.sh "$s9/res/peers" > "$s9/res/peers.log" 2>&1
  echo "peers exit $? $(date -u +%T)"; touch "$s9/peers.done"
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
    sleep 15; status ;;
  part)
    n=${2:?part number}
    mkdir -p /tmp/te && cp ".whl/te/core.part.0$n" /tmp/te/ && ls -la /tmp/te; status ;;
  te)
    t0=$(date +%s)
    site  # the install's import check needs pydantic (in /tmp/site)
    bash .device/te-install.sh .whl/te/small > "$out/te_install.log" 2>&1
    echo "te-install exit $? after $(( $(date +%s) - t0 ))s"; tail -3 "$out/te_install.log"
    cp /tmp/te/out/transformer_engine_torch-*.whl "$out/" 2>/dev/null
    rm -rf "$s9/repo2" && mkdir -p "$s9/repo2" && cp -a . "$s9/repo2/" && rm -rf "$s9/repo2/.whl/te"
    export -f te_job site; export s9
    setsid bash -c te_job > "$s9/te_job.log" 2>&1 < /dev/null &
    sleep 5; status; cat "$s9/te_job.log" ;;
  poll)
    limit=${2:-540}; w=0
    until [ -f "$s9/peers.done" ] || [ $w -ge "$limit" ]; do sleep 10; w=$((w + 10)); done
    status; echo "--- te job:"; cat "$s9/te_job.log" 2>/dev/null
    tail -4 "$s9/res/te.log" "$s9/res/cal.log" "$s9/res/peers.log" 2>/dev/null
    # bring back each finished job's results once (the gen job's, then te, cal, peers)
    mkdir -p "$s9/sent"
    for j in gen te cal peers; do
      [ -f "$s9/$j.done" ] && [ ! -f "$s9/sent/$j" ] || continue
      if [ $j = gen ]; then cp -a "$s9/gen" "$out/gen"; cp "$s9/gen_job.log" "$out/gen/"; else cp -a "$s9/res/$j" "$out/$j"; cp "$s9/res/$j.log" "$out/$j/" 2>/dev/null; fi
      touch "$s9/sent/$j"
    done
    cp "$s9/gen_job.log" "$s9/te_job.log" "$out/" 2>/dev/null
    pack "poll_$(date +%H%M%S)" ;;
esac
