#!/usr/bin/env bash
# Session 7 (issue #17, exact resume): where does a deterministic resumed run first differ from
# the uninterrupted one? bench/results/exact_resume_h200.json found every weight, optimizer
# moment, step count, scheduler and RNG state bitwise equal before the first step after the
# stop, yet that step's loss 1.9e-5 off. Here 8-step runs of the demo in deterministic mode
# (SDPA efficient backend, torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8),
# with bench/gpu/resume_probe.py fingerprinting each step's state, batch, hidden states and loss:
#   dA  uninterrupted, save at 4, eval at 4;   dR  the same, SIGTERM after step 4, resumed to 8
#   dN  uninterrupted, save at 4, no eval before 8;  dNR  the same, stopped after 4, resumed
#   dX  uninterrupted, no save and no eval before 8 (what a save or an eval changes)
# Compile (CPU machine): bash bench/gpu/session7_diag.sh --compile .device/s7d
# Device (carry .whl/mc .whl/dl .data .device):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mc/*.whl .whl/dl/*.whl \
#     && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 && bash bench/gpu/session7_diag.sh $OUT
set -u
if [ "${1:-}" = "--compile" ]; then
  dest=${2:?usage: session7_diag.sh --compile DEST}
  PY=${PY:-.venv/bin/python}
  mkdir -p "$dest" && cp -r /work/shared/data/tokenizers/gpt2 "$dest/gpt2"
  for name in dA dR dN dNR dX; do
    sets=(--set "name=\"$name\"" --set "data.tokenizer.vocab_file=\"$dest/gpt2/vocab.json\""
          --set "data.tokenizer.merge_file=\"$dest/gpt2/merges.txt\""
          --set 'data.train=[{prefix=".data/pydocs-train_text_document", weight=1.0}]'
          --set 'data.valid=[{prefix=".data/pydocs-valid_text_document", weight=1.0}]'
          --set train.train_iters=8 --set train.lr_warmup_iters=2 --set logging.log_interval=1
          --set train.eval_iters=2 --set 'kernels.sdpa_backend="efficient"')
    case $name in
      dA|dR) sets+=(--set checkpoint.save_interval=4 --set train.eval_interval=4) ;;
      dN|dNR) sets+=(--set checkpoint.save_interval=4 --set train.eval_interval=8) ;;
      dX) sets+=(--set checkpoint.save_interval=8 --set train.eval_interval=8) ;;
    esac
    "$PY" -m dlmspec.cli compile specs/demo-dlm.toml -o "$dest/$name" --force "${sets[@]}" > "$dest/$name.compile.log" 2>&1 \
      || { cat "$dest/$name.compile.log"; exit 1; }
    sed -i 's/^import torch$/import torch\ntorch.use_deterministic_algorithms(True)  # session7_diag.sh\nimport resume_probe; resume_probe.install()  # session7_diag.sh/' "$dest/$name/train.py"
    grep -q "^import resume_probe" "$dest/$name/train.py" || exit 1
    cp bench/gpu/resume_probe.py "$dest/$name/"
  done
  echo "compiled into $dest: $(ls "$dest" | tr '\n' ' ')"; exit 0
fi
out=${1:?usage: session7_diag.sh OUT_DIR}
S=${S:-.device/s7d}
export CUBLAS_WORKSPACE_CONFIG=:4096:8 RESUME_PROBE_AT=3,4,5,6 RESUME_PROBE_INPUTS=1
mkdir -p "$out"
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-400} ))
rem() { local r=$(( DEADLINE - $(date +%s) )); [ $r -gt 1 ] && echo $r || echo 1; }
launch() {  # NAME LOG [STOP]: one launch; with STOP, SIGTERM once iteration STOP is logged
  local name=$1 log=$2 stop=${3:-} t0=$(date +%s)
  timeout -s KILL "$(rem)" bash "$S/$name/launch.sh" > "$log" 2>&1 &
  local pid=$!
  if [ -n "$stop" ]; then
    while kill -0 "$pid" 2>/dev/null; do
      if grep -q "\"iteration\": $stop, " "runs/$name/metrics.jsonl" 2>/dev/null; then
        kill -TERM "$pid"; echo "SIGTERM after iteration $stop was logged" >> "$log"; break
      fi
      sleep 0.1
    done
  fi
  wait "$pid"; echo "$name exit $? after $(( $(date +%s) - t0 ))s" | tee -a "$log"
}
if [ "${PART:-}" = "layers" ]; then
  # Session 8: dN and dNR again, tracing step 5's forward module by module (RESUME_PROBE_LAYERS=5:
  # runs/<name>/layers.jsonl) and fingerprinting buffers, non-parameter tensor attributes,
  # train/eval flags and torch's backend flags before step 5 (RESUME_PROBE_AT=4).
  export RESUME_PROBE_LAYERS=5 RESUME_PROBE_AT=4 RESUME_PROBE_SDPA=1
  for n in dN dNR; do rm -rf "runs/$n"; done
  launch dN "$out/dN.log" & p1=$!
  (launch dNR "$out/dNR.1.log" 4; launch dNR "$out/dNR.2.log") & p2=$!
  wait $p1 $p2
  names="dN dNR"
elif [ "${PART:-}" = "fusion" ]; then
  # Second call: dN/dNR again with megatron-core's torch.compile'd fusions off (fA, fR:
  # bias_activation_fusion and bias_dropout_fusion False in train.py), and with them on but
  # TorchInductor's caches off (cA, cR: TORCHINDUCTOR_FORCE_DISABLE_CACHES=1). Made on the CPU
  # machine by copying .device/s7d/dN to fA fR cA cR (names replaced with sed) and, in fA/fR,
  # sed 's/bias_activation_fusion=True,/...=False,/; s/bias_dropout_fusion=True,/...=False,/'.
  for n in fA fR cA cR; do rm -rf "runs/$n"; done
  launch fA "$out/fA.log" & p1=$!
  (launch fR "$out/fR.1.log" 4; launch fR "$out/fR.2.log") & p2=$!
  (export TORCHINDUCTOR_FORCE_DISABLE_CACHES=1; launch cA "$out/cA.log") & p3=$!
  (export TORCHINDUCTOR_FORCE_DISABLE_CACHES=1; launch cR "$out/cR.1.log" 4; launch cR "$out/cR.2.log") & p4=$!
  wait $p1 $p2 $p3 $p4
  names="fA fR cA cR"
else
names="dA dR dN dNR dX"
for n in dA dR dN dNR dX; do rm -rf "runs/$n"; done
launch dA "$out/dA.log" & pa=$!
until grep -q '"event": "train"' runs/dA/metrics.jsonl 2>/dev/null || ! kill -0 "$pa" 2>/dev/null; do sleep 0.5; done
launch dN "$out/dN.log" & p1=$!
launch dX "$out/dX.log" & p2=$!
(launch dR "$out/dR.1.log" 4; launch dR "$out/dR.2.log") & p3=$!
(launch dNR "$out/dNR.1.log" 4; launch dNR "$out/dNR.2.log") & p4=$!
wait $pa $p1 $p2 $p3 $p4
fi
for n in $names; do
  for f in metrics probe inputs layers sdpa; do cp "runs/$n/$f.jsonl" "$out/$n.$f.jsonl" 2>/dev/null; done
  ls "runs/$n/checkpoints" > "$out/$n.checkpoints.txt" 2>&1; rm -rf "runs/$n/checkpoints"
done
grep -h " exit \|SIGTERM" "$out"/*.log
grep -l Traceback "$out"/*.log && grep -h -B2 -A8 Traceback "$out"/*.log | head -40
tar czf "$out/diag.tgz" -C "$out" $(cd "$out" && ls *.log *.jsonl *.txt) && rm -f "$out"/*.log "$out"/*.jsonl "$out"/*.txt
