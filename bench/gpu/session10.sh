#!/usr/bin/env bash
# Session 10 on one H200: one machine, held for back-to-back device calls (it goes back ~30 s after a
# call). The long jobs run in process sessions of their own (setsid), which outlive the call that
# started them, from copies of the checkout under /tmp/s10; the calls in between only report progress
# and bring back what has finished (session9.sh's pattern; session 9 lost work by a gap between calls).
#
# CPU machine first (repository root):
#   .venv/bin/python bench/gpu/sft_prepare.py                                  # .data, .device/sft-demo/{base,sft}
#   .venv/bin/python bench/gpu/sft_prepare.py --pad-eos-tokens 8 --variant pad8  # .device/sft-demo/pad8
#   .venv/bin/python bench/gpu/sft_answers.py prompts                          # .data/sft/heldout_prompts*.jsonl
#   .venv/bin/python bench/gpu/te_matrix.py --dry --only "$TE1,$TE2"          # .device/te (TE1, TE2 below)
#   bash bench/gpu/te_calibration.sh --dry                                     # .device/tecal
#   bash bench/gpu/te_calibration.sh --dry --profile --only te-fp8-delayed-mb8 --dest .device/teprof
#   rm -f .whl/dl/*.whl && .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl/dl .
#   bash ../shared/gpu/te-parts.sh; cp ../shared/gpu/te-install.sh .device/te-install.sh
#   (.whl/mc: megatron-core 0.16.1 + pydantic's wheels; .whl/mc19: 0.19.2; .whl/peer: Liger 0.8.5, torchao 0.18)
# Device calls, in order (carry in brackets):
#   STEP=start  [.whl/mc .whl/dl .whl/mc19 .data .device/sft-demo .device/te .whl/te/core.part.05]
#       installs megatron-core + dlmspec into /tmp/site; starts the SFT job (gen_job: base pre-training,
#       then SFT with every padding EOS supervised and with 8, their evaluations and answers) and the
#       TE matrix's local rows (te1_job: the references of the TE rows, and megatron-core 0.19.2);
#   STEP=part N [.whl/te/core.part.0N (+ .whl/peer with N=0)]   (N = 0..4) one part of TE's core wheel;
#   STEP=te     [.whl/te/small .whl/te/core.md5 .device/tecal .device/teprof .device/te-install.sh]
#       installs TE and starts te_job: the TE matrix's TE rows against te1's (--reuse), then, the GPU
#       alone, te_calibration.sh, peers.sh (te-fp8 beside the HF peers) and one profiled
#       fp8 run, each within what is left of DONE_S (default 1590 s after the start call began);
#   STEP=poll S  waits up to S seconds (or until everything is done) and brings back what finished.
set -u
out=${1:?usage: STEP=start|part|te|poll session10.sh OUT [N]}
s10=/tmp/s10
mkdir -p "$s10"
TE1=local-bf16,local-qwen3,local-bf16-again,local-megadlms-window,mc19-local-qwen3,local-moe,local-init-from-hf,mc19-local-bf16
# session 10 also ran te-fp8-dpa,te-fp8-tensorwise-dpa (fp8 attention): TE found no backend for them and
# validate now refuses them, so the rows are gone (bench/results/gpu_runs_h200_peers_te_matrix_sft_answers/te_matrix_te/)
TE2=te-megadlms-window,te-moe,te-init-from-hf
# every job is done DONE_S seconds after the start call began (the machine is held 30 minutes at most)
DONE_S=${DONE_S:-1590}
REUSE=local-megadlms-window,local-moe,local-init-from-hf,local-bf16,local-bf16-again
site() { export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1; }
left() { echo $(( $(cat "$s10/t0") + DONE_S - $(date +%s) )); }  # seconds to the deadline
least() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }
gen_job() {  # #19: the demo pre-trained, fine-tuned two ways, evaluated, answering; results in $s10/gen
  cd "$s10/repo" || exit 1
  site
  local g=$s10/gen r=runs/bench-sft-demo
  mkdir -p "$g/sft" "$g/pad8"
  echo "gen_job start $(date -u +%T)"
  STAGE=base OUT=$g/sft PYTHON=python3 timeout 300 bash bench/gpu/sft_demo.sh > "$g/sft_base.log" 2>&1
  echo "base pre-training exit $? $(date -u +%T)"
  # SFT as the spec says (every padding EOS supervised) and with stage.sft.pad_eos_tokens = 8, at once
  STAGE=sft OUT=$g/sft PYTHON=python3 timeout 300 bash bench/gpu/sft_demo.sh > "$g/sft.log" 2>&1 &
  (
    # after the first SFT run has trained a step: its data index files are built (not by two at once)
    w=0; until grep -qs '"train"' $r/sft/metrics.jsonl || [ $w -ge 120 ]; do sleep 2; w=$((w + 2)); done
    t0=$(date +%s)
    timeout 300 bash .device/sft-demo/pad8/launch.sh > "$g/pad8/sft_launch.log" 2>&1
    echo "SFT (pad8) exit $? after $(( $(date +%s) - t0 ))s" | tee -a "$g/pad8/sft_launch.log"
    cp $r/pad8/metrics.jsonl "$g/pad8/sft_metrics.jsonl" 2>/dev/null
    timeout 200 python3 bench/gpu/sft_eval.py --train-py .device/sft-demo/pad8/train.py \
      --data .data/demo-sft-heldout_text_document --base $r/base/checkpoints --tuned $r/pad8/checkpoints \
      --out "$g/pad8/sft_demo_h200.json" --draws 4 --max-samples 512 --seed 1234 > "$g/pad8/eval.log" 2>&1
    echo "evaluation (pad8) exit $?" | tee -a "$g/pad8/eval.log"
  ) > "$g/pad8.log" 2>&1 &
  wait
  echo "sft + pad8 + evaluations done $(date -u +%T)"
  for m in base sft pad8; do
    # the base model has no embeddings for the chat tokens' ids: it reads the prompts as text
    p=.data/sft/heldout_prompts.jsonl; [ $m = base ] && p=.data/sft/heldout_prompts_base.jsonl
    timeout 150 python3 -m dlmspec.cli generate "$r/$m" --prompts $p \
      --gen-length 64 --steps 64 --block-length 32 --batch-size 8 --json > "$g/answers_$m.json" 2> "$g/answers_$m.err" &
  done
  wait
  for m in sft pad8; do
    python3 bench/gpu/sft_answers.py table "$g/answers_base.json" "$g/answers_$m.json" \
      .data/sft/heldout_prompts.jsonl "$g/sft_answers_${m}_h200.json" > "$g/answers_table_$m.log" 2>&1
    echo "answers table $m exit $?"
  done
  echo "gen_job done $(date -u +%T)"
  rm -rf $r/sft/checkpoints $r/pad8/checkpoints
  touch "$s10/gen.done"
}
te1_job() {  # the TE matrix's local rows (no TE needed), megatron-core 0.19.2 included; in $s10/repoA
  cd "$s10/repoA" || exit 1
  site
  mkdir -p "$s10/res/te1"
  echo "te1_job start $(date -u +%T)"
  python3 bench/gpu/te_matrix.py "$s10/res/te1" --only "$TE1" --lanes 4 --budget-s 330 > "$s10/res/te1.log" 2>&1
  echo "te1_job exit $? $(date -u +%T)"
  touch "$s10/te1.done"
}
te_job() {  # after TE's install: the TE rows, then (the GPU alone) calibration, peers, profile; in repoA
  cd "$s10/repoA" || exit 1
  site; export PYTHONPATH=/tmp/site_te:$PYTHONPATH
  mkdir -p "$s10/res/te2" "$s10/res/cal" "$s10/res/peers" "$s10/res/prof"
  w=0; until [ -f "$s10/te1.done" ] || [ $w -ge 300 ]; do sleep 3; w=$((w + 3)); done
  echo "te_job: waited ${w}s for te1 $(date -u +%T)"
  python3 bench/gpu/te_matrix.py "$s10/res/te2" --only "$TE2" --reuse "$s10/res/te1:$REUSE" --lanes 5 \
    --budget-s "${TE2_BUDGET_S:-200}" > "$s10/res/te2.log" 2>&1
  echo "te_matrix (TE rows) exit $? $(date -u +%T)"; touch "$s10/te2.done"
  rm -rf runs/te runs/te-hf
  w=0; until [ -f "$s10/gen.done" ] || [ $w -ge 200 ]; do sleep 3; w=$((w + 3)); done
  echo "te_job: waited ${w}s for the SFT job $(date -u +%T)"
  # the calibration first (at most 700 s, leaving the peers 300 s), then the peers, then the profile
  b=$(least 700 $(( $(left) - 300 ))); echo "te_calibration budget ${b}s $(date -u +%T)"
  BUDGET_S=$b bash bench/gpu/te_calibration.sh "$s10/res/cal" --repeats 0 --min-start-s 80 > "$s10/res/cal.log" 2>&1
  echo "te_calibration exit $? $(date -u +%T)"; touch "$s10/cal.done"
  rm -rf .device/runs/tecal
  b=$(least 420 $(( $(left) - 15 ))); echo "peers budget ${b}s $(date -u +%T)"
  # (as run in session 10, te-fp8,te-fp8-dpa; te-fp8-dpa is gone since: validate refuses fp8 attention
  # for bidirectional attention, the TE rows' finding)
  MEGATRON_VARIANTS=te-fp8 WHL=.whl/peer BUDGET_S=$b bash bench/gpu/peers.sh "$s10/res/peers" \
    > "$s10/res/peers.log" 2>&1
  echo "peers exit $? $(date -u +%T)"; touch "$s10/peers.done"
  rm -rf /tmp/peers-work
  b=$(( $(left) - 5 )); echo "profile budget ${b}s $(date -u +%T)"
  if [ "$b" -ge 100 ]; then
    BUDGET_S=$b bash bench/gpu/te_calibration.sh "$s10/res/prof" --profile --only te-fp8-delayed-mb8 \
      --dest .device/teprof --repeats 0 > "$s10/res/prof.log" 2>&1
    echo "profile exit $? $(date -u +%T)"
  else
    echo "profile not run: ${b}s left" | tee "$s10/res/prof.log"
  fi
  touch "$s10/prof.done"
}
pack() {  # one archive of everything in $out
  ls -R "$out" | head -60
  tar czf "/tmp/session10_$1.tgz" -C "$out" . && rm -rf "${out:?}"/* && mv "/tmp/session10_$1.tgz" "$out/"
  ls -la "$out"
}
status() {
  echo "--- $(date -u +%T)"; cat "$s10/gen_job.log" "$s10/te1_job.log" "$s10/te_job.log" 2>/dev/null
  ls "$s10" 2>/dev/null | tr '\n' ' '; echo
  tail -n 3 "$s10"/res/*.log 2>/dev/null | grep -v "warn" | tail -n 24
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
}
case "${STEP:?}" in
  start)
    date +%s > "$s10/t0"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv; python3 --version; df -h /tmp | tail -1
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mc/*.whl .whl/dl/*.whl || exit 1
    mkdir -p /tmp/te && cp .whl/te/core.part.05 /tmp/te/
    for d in repo repoA; do rm -rf "${s10:?}/$d" && mkdir -p "$s10/$d" && cp -a . "$s10/$d/" && rm -rf "$s10/$d/.whl/te"; done
    export -f gen_job te1_job site; export s10 TE1
    setsid bash -c gen_job > "$s10/gen_job.log" 2>&1 < /dev/null &
    setsid bash -c te1_job > "$s10/te1_job.log" 2>&1 < /dev/null &
    sleep 20; status ;;
  part)
    n=${2:?part number}
    mkdir -p /tmp/te && cp ".whl/te/core.part.0$n" /tmp/te/ && ls -la /tmp/te
    [ -d .whl/peer ] && mkdir -p "$s10/repoA/.whl" && cp -a .whl/peer "$s10/repoA/.whl/"
    status ;;
  te)
    t0=$(date +%s)
    site  # the install's import check needs pydantic (in /tmp/site)
    bash .device/te-install.sh .whl/te/small > "$out/te_install.log" 2>&1
    echo "te-install exit $? after $(( $(date +%s) - t0 ))s"; tail -3 "$out/te_install.log"
    cp /tmp/te/out/transformer_engine_torch-*.whl "$out/" 2>/dev/null
    cp -a .device/tecal .device/teprof "$s10/repoA/.device/"
    export -f te_job site left least; export s10 TE2 REUSE DONE_S
    setsid bash -c te_job > "$s10/te_job.log" 2>&1 < /dev/null &
    sleep 5; status ;;
  poll)
    limit=${2:-540}; w=0
    until [ -f "$s10/prof.done" ] || [ $w -ge "$limit" ]; do sleep 10; w=$((w + 10)); done
    status
    # bring back each finished job's results once
    mkdir -p "$s10/sent"
    for j in gen te1 te2 cal peers prof; do
      [ -f "$s10/$j.done" ] && [ ! -f "$s10/sent/$j" ] || continue
      if [ $j = gen ]; then cp -a "$s10/gen" "$out/gen"; else cp -a "$s10/res/$j" "$out/$j"; cp "$s10/res/$j.log" "$out/$j/" 2>/dev/null; fi
      touch "$s10/sent/$j"
    done
    cp "$s10"/*_job.log "$out/" 2>/dev/null
    pack "poll_$(date +%H%M%S)" ;;
esac
