#!/usr/bin/env bash
# Session 7 (issue #17, "Exact resume") on one H200: the demo (specs/demo-dlm.toml, [kernels] all
# off as shipped) run twice uninterrupted (A, B) and once stopped by SIGTERM twice (after step
# 100 and after step 200 are logged) and launched again to 300 (R), all with the same seed and
# every step logged; the same three again with bitwise-reproducible kernels ("det": SDPA memory-efficient
# backend, torch.use_deterministic_algorithms(True), CUBLAS_WORKSPACE_CONFIG=:4096:8). PART=timing
# instead times 100 steps of the demo with kernels.qkv_fusion / compiled_norm / apply_rope_fusion
# all false and all true (off, on, on, off; one run at a time).
#
# Prepare (CPU machine, the worktree with the branch; the device copies /work/main):
#   PY=$PWD/.venv/bin/python; $PY -m pip wheel -q --no-deps --no-build-isolation -w /tmp/w . \
#     && rm -f /work/main/.whl/dl/*.whl && cp /tmp/w/dlmspec-*.whl /work/main/.whl/dl/
#   bash bench/gpu/session7_resume.sh --compile /work/main/.device/s7    (the compiled dirs, below)
#   cp bench/gpu/session7_resume.sh /work/main/.device/
# Device (repository root; carry .whl/mc .whl/dl .data .device):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mc/*.whl .whl/dl/*.whl \
#     && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 && bash .device/session7_resume.sh $OUT
#   (PART=timing bash .device/session7_resume.sh $OUT for the kernel timing)
# Summarise (CPU machine):
#   python3 bench/gpu/summarize_exact_resume.py OUT bench/results/exact_resume_h200.json
set -u

if [ "${1:-}" = "--compile" ]; then
  # The compiled directories, each with run and checkpoint directories of its own.
  dest=${2:?usage: session7_resume.sh --compile DEST}
  PY=${PY:-.venv/bin/python}
  mkdir -p "$dest" && cp -r /work/shared/data/tokenizers/gpt2 "$dest/gpt2"
  tok="data.tokenizer.vocab_file=\"${dest#/work/main/}/gpt2/vocab.json\""
  mer="data.tokenizer.merge_file=\"${dest#/work/main/}/gpt2/merges.txt\""
  compile() {  # NAME --set...
    local name=$1; shift
    local sets=(--set "logging.run_dir=\"runs/$name\"" --set "logging.tensorboard_dir=\"runs/$name/tensorboard\""
                --set "checkpoint.save=\"runs/$name/checkpoints\"" --set "$tok" --set "$mer")
    for s in "$@"; do sets+=(--set "$s"); done
    "$PY" -m dlmspec.cli compile specs/demo-dlm.toml -o "$dest/$name" --force "${sets[@]}" > /dev/null 2>&1 || exit 1
  }
  for v in nd det; do
    extra=(); [ $v = det ] && extra=('kernels.sdpa_backend="efficient"')
    for r in A B C R; do compile "$v-$r" logging.log_interval=1 "${extra[@]}"; done
  done
  for r in A B R; do  # bitwise-reproducible kernels, and the probe (bench/gpu/resume_probe.py): lines after `import torch`
    sed -i 's/^import torch$/import torch\ntorch.use_deterministic_algorithms(True)  # session7_resume.sh: bitwise-reproducible kernels\nimport resume_probe; resume_probe.install()  # session7_resume.sh: fingerprints before steps 101, 102, 201, 202/' \
      "$dest/det-$r/train.py"
    grep -q "^torch.use_deterministic_algorithms(True)" "$dest/det-$r/train.py" || exit 1
    cp bench/gpu/resume_probe.py "$dest/det-$r/"
  done
  compile time-off train.train_iters=100
  compile time-on train.train_iters=100 kernels.qkv_fusion=true kernels.compiled_norm=true kernels.apply_rope_fusion=true
  echo "compiled into $dest: $(ls "$dest" | tr '\n' ' ')"
  exit 0
fi

out=${1:?usage: session7_resume.sh OUT_DIR}
S7=${S7:-.device/s7}
mkdir -p "$out"
# Every launch is killed (with its process group) at DEADLINE, so the results are packed before
# the device call's limit.
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-530} ))
rem() { local r=$(( DEADLINE - $(date +%s) )); [ $r -gt 1 ] && echo $r || echo 1; }
python3 -P - > "$out/where.txt" 2>&1 <<'PY'
import dlmspec, dlmspec.backends.megatron.training as t, megatron.core, torch
print("dlmspec", dlmspec.__file__)
print("runtime", t.__file__)
print("megatron-core", megatron.core.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0))
PY
cat "$out/where.txt"

uninterrupted() {  # NAME: one launch to the end
  local name=$1 t0=$(date +%s)
  rm -rf "runs/$name"
  timeout -s KILL "$(rem)" bash "$S7/$name/launch.sh" > "$out/$name.log" 2>&1
  echo "$name exit $? after $(( $(date +%s) - t0 ))s" | tee -a "$out/$name.log"
}

stopped() {  # NAME STOP...: SIGTERM to the launcher (torchrun) once each STOP is logged, then a last launch
  local name=$1; shift
  rm -rf "runs/$name"
  local n=0
  for stop in "$@"; do
    n=$((n + 1)); local t0=$(date +%s)
    timeout -s KILL "$(rem)" bash "$S7/$name/launch.sh" > "$out/$name.launch$n.log" 2>&1 &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
      if grep -q "\"iteration\": $stop, " "runs/$name/metrics.jsonl" 2>/dev/null; then
        kill -TERM "$pid"; echo "SIGTERM after iteration $stop was logged ($(( $(date +%s) - t0 ))s)" >> "$out/$name.launch$n.log"
        break
      fi
      sleep 0.2
    done
    wait "$pid"; echo "$name launch $n exit $? after $(( $(date +%s) - t0 ))s" | tee -a "$out/$name.launch$n.log"
  done
  n=$((n + 1)); local t0=$(date +%s)
  timeout -s KILL "$(rem)" bash "$S7/$name/launch.sh" > "$out/$name.launch$n.log" 2>&1
  echo "$name launch $n exit $? after $(( $(date +%s) - t0 ))s" | tee -a "$out/$name.launch$n.log"
}

collect() {  # NAME...: metrics and the checkpoints' list; then the checkpoints are deleted
  for name in "$@"; do
    cp "runs/$name/metrics.jsonl" "$out/$name.metrics.jsonl" 2>/dev/null
    cp "runs/$name/probe.jsonl" "$out/$name.probe.jsonl" 2>/dev/null
    ls "runs/$name/checkpoints" > "$out/$name.checkpoints.txt" 2>&1
    rm -rf "runs/$name/checkpoints"
  done
}

if [ "${PART:-resume}" = "timing" ]; then
  for name in time-off time-on time-on time-off; do
    uninterrupted "$name"; n=1; while [ -e "$out/$name.$n.metrics.jsonl" ]; do n=$((n + 1)); done
    cp "runs/$name/metrics.jsonl" "$out/$name.$n.metrics.jsonl"; mv "$out/$name.log" "$out/$name.$n.log"
    rm -rf "runs/$name/checkpoints"
  done
  grep -h "exit" "$out"/time-*.log
  tar czf "$out/timing.tgz" -C "$out" $(cd "$out" && ls *.log *.jsonl) && rm -f "$out"/*.log "$out"/*.jsonl
  exit 0
fi

if [ "${PART:-resume}" = "s8" ]; then
  # Session 8 (after the first-SDPA-call fix): nd A, B, C uninterrupted and R stopped twice; det A
  # and R (det A = B bitwise was shown in session 7). Same order of start as below.
  for name in nd-A nd-B nd-C nd-R det-A det-R; do rm -rf "runs/$name"; done
  uninterrupted nd-A & pa=$!
  until grep -q '"event": "train"' runs/nd-A/metrics.jsonl 2>/dev/null || ! kill -0 "$pa" 2>/dev/null; do sleep 0.5; done
  uninterrupted nd-B & pb=$!
  uninterrupted nd-C & pc=$!
  stopped nd-R 100 200 & pr=$!
  (export CUBLAS_WORKSPACE_CONFIG=:4096:8; uninterrupted det-A) & qa=$!
  (export CUBLAS_WORKSPACE_CONFIG=:4096:8; stopped det-R 100 200) & qr=$!
  wait $pa $pb $pc $pr $qa $qr
  collect nd-A nd-B nd-C nd-R det-A det-R
  grep -h " exit \|SIGTERM after" "$out"/*.log
  tar czf "$out/resume.tgz" -C "$out" $(cd "$out" && ls *.log *.txt *.jsonl | grep -v where.txt) \
    && rm -f "$out"/*.log "$out"/*.jsonl "$out"/*.checkpoints.txt
  exit 0
fi

# A first (it builds megatron-core's index cache beside the data), the others once it trains;
# all six share the GPU (12.6 GiB each; launch-bound at this size).
for name in nd-A nd-B nd-R det-A det-B det-R; do rm -rf "runs/$name"; done
uninterrupted nd-A &
pa=$!
until grep -q '"event": "train"' runs/nd-A/metrics.jsonl 2>/dev/null || ! kill -0 "$pa" 2>/dev/null; do sleep 0.5; done
uninterrupted nd-B & pb=$!
stopped nd-R 100 200 & pr=$!
(export CUBLAS_WORKSPACE_CONFIG=:4096:8; uninterrupted det-A) & qa=$!
(export CUBLAS_WORKSPACE_CONFIG=:4096:8; uninterrupted det-B) & qb=$!
(export CUBLAS_WORKSPACE_CONFIG=:4096:8; stopped det-R 100 200) & qr=$!
wait $pa $pb $pr $qa $qb $qr
collect nd-A nd-B nd-R det-A det-B det-R
grep -h " exit \|SIGTERM after" "$out"/*.log
grep -l "Traceback" "$out"/*.log && grep -h -A3 "Error" "$out"/*.log | sort | uniq -c | sort -rn | head -20
# at most 8 files come back: where.txt and one archive
tar czf "$out/resume.tgz" -C "$out" $(cd "$out" && ls *.log *.txt *.jsonl | grep -v where.txt) \
  && rm -f "$out"/*.log "$out"/*.jsonl "$out"/*.checkpoints.txt
