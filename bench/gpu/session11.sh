#!/usr/bin/env bash
# Session 11 on one H200 (issue 21): every measurement runs inside ONE device call and leaves its
# results in $OUT before the call ends (sessions 9 and 10 lost their calibration to jobs that outlived
# a call: the machine goes back ~30 s after one). Each call stops itself ~15 s before its DEADLINE_S.
#
# CPU machine first (repository root):
#   .venv/bin/python bench/gpu/te_matrix.py --dry --only te-moe,te-init-from-hf \
#       --reuse bench/results/gpu_runs_h200_peers_te_matrix_sft_answers/te_matrix_local:local-moe,local-init-from-hf   # .data, .device/te
#   bash bench/gpu/te_calibration.sh --dry                                                 # .device/tecal
#   bash bench/gpu/te_calibration.sh --dry --profile --only te-fp8-delayed-mb8 --dest .device/teprof
#   .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl/dl .
#   bash ../shared/gpu/te-parts.sh; cp ../shared/gpu/te-install.sh .device/te-install.sh
#   (.whl/mc: megatron-core 0.16.1 + pydantic's wheels; .whl/peer: Liger Kernel 0.8.5, torchao 0.18.0)
# Device calls, back to back (carry in brackets):
#   STEP=start  [.whl/mc .whl/dl .whl/te/core.part.05 .device/te-install.sh]  megatron-core + dlmspec into /tmp/site
#   STEP=part N [.whl/te/core.part.0N]  (N = 0..4)
#   STEP=te     [.whl/te/small .whl/te/core.md5 .device/te-install.sh .device/tecal]
#       TE into /tmp/site_te, then the calibration entries of CAL_A
#   STEP=cal    [.device/tecal .device/te .data]  the calibration entries of CAL_B (ROWS_S = 235 s kept back),
#       then the TE rows te-moe and te-init-from-hf against session 10's local rows (te_matrix --reuse)
#   STEP=peers  [.whl/peer .device/teprof]  the profiled fp8 run (at most 100 s), then TE fp8 beside the
#       HF peers (one run.py run) in what is left
#   STEP=rows   [.device/te .data]  (added after session 11, for the next one) the te_matrix rows ROWS
#       (default: te-moe and te-init-from-hf with their local references, on one machine) in 4 lanes,
#       compiled into DEST (default .device/te), into $OUT/NAME (default rows)
# Session 12: CAL_A= THEN=rows STEP=te (TE, then the default rows in the same call), then
#   TE_MATRIX_STEPS=50 DEST=.device/te50 NAME=agree50 ROWS=local-bf16,local-bf16-again,te-bf16,te-fp8-delayed,\
#   te-fp8-tensorwise,te-fp8-blockwise STEP=rows (compiled with the same TE_MATRIX_STEPS=50 --dry --dest .device/te50),
#   then CAL_ROWS=0 ROWS_S=0 ONLY=... STEP=cal for calibration repeats (no rows after).
# A call returns at most 8 files: PACK=1 leaves one archive, $OUT/STEP.tgz (session 11's calls 1 and 2
# ran without it, and te_rows/te-moe.json and its log did not come back).
set -u
out=${1:?usage: STEP=start|part|te|cal|peers|rows session11.sh OUT [N]}
t0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-585}
left() { echo $(( t0 + DEADLINE_S - 15 - $(date +%s) )); }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
CAL_A=${CAL_A-te-bf16-mb8,te-fp8-delayed-mb8,te-bf16-mb12,te-fp8-tensorwise-mb8,te-fp8-delayed-mb12-selective}
CAL_B=te-moe-e8-top2-mb4,te-bf16-mb4,te-fp8-tensorwise-mb16-full,te-bf16-mb16-selective
te_on() { export PYTHONPATH=/tmp/site_te:/tmp/site; }
cal() {  # te_calibration of entries $1 into $out/$2 within what is left
  local b; b=$(left)
  echo "te_calibration $1: budget ${b}s $(date -u +%T)"
  BUDGET_S=$b bash bench/gpu/te_calibration.sh "$out/$2" --only "$1" --repeats "${REPEATS:-0}" --min-start-s 80 \
    > "$out/$2.log" 2>&1
  echo "te_calibration exit $? $(date -u +%T)"; grep -h "te_calibration:" "$out/$2.log" | tail -n 12
  rm -rf .device/runs/tecal
}
rows() {  # te_matrix rows $ROWS (compiled into $DEST) into $out/$NAME within what is left
  local b r=${ROWS:-te-moe,local-moe,te-init-from-hf,local-init-from-hf} n=${NAME:-rows}
  b=$(left)
  echo "te_matrix $r (${TE_MATRIX_STEPS:-40} steps): budget ${b}s $(date -u +%T)"
  python3 bench/gpu/te_matrix.py "$out/$n" --dest "${DEST:-.device/te}" --only "$r" --lanes 4 --budget-s "$b" \
    > "$out/$n.log" 2>&1
  echo "te_matrix exit $? $(date -u +%T)"; grep -h "agree\|exit" "$out/$n.log" | tail -n 12
  rm -rf runs/te runs/te-hf
}
exit_pack() {  # PACK=1: everything in $out as one archive
  if [ "${PACK:-0}" = 1 ]; then
    tar czf "/tmp/$STEP.tgz" -C "$out" . && rm -rf "${out:?}"/* && mv "/tmp/$STEP.tgz" "$out/" && ls -la "$out"
  fi
}
case "${STEP:?}" in
  start)
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv; python3 --version; df -h /tmp | tail -1
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mc/*.whl .whl/dl/*.whl || exit 1
    mkdir -p /tmp/te && cp .whl/te/core.part.05 /tmp/te/ && ls /tmp/te ;;
  part)
    mkdir -p /tmp/te && cp ".whl/te/core.part.0${2:?part number}" /tmp/te/ && ls /tmp/te ;;
  te)
    bash .device/te-install.sh .whl/te/small > "$out/te_install.log" 2>&1
    echo "te-install exit $? after $(( $(date +%s) - t0 ))s"; tail -n 2 "$out/te_install.log"
    cp /tmp/te/out/transformer_engine_torch-*.whl "$out/" 2>/dev/null
    te_on
    [ -n "$CAL_A" ] && cal "$CAL_A" cal_a
    [ "${THEN:-}" = rows ] && rows ;;
  cal)
    te_on; DEADLINE_S=$(( DEADLINE_S - ${ROWS_S:-235} )) cal "${ONLY:-$CAL_B}" cal_b
    [ "${CAL_ROWS:-1}" = 1 ] || { ls -R "$out" | head -40; exit_pack; exit 0; }
    b=$(left)
    echo "te_matrix te-moe,te-init-from-hf: budget ${b}s $(date -u +%T)"
    python3 bench/gpu/te_matrix.py "$out/te_rows" --only te-moe,te-init-from-hf --lanes 2 --budget-s "$b" \
      --reuse bench/results/gpu_runs_h200_peers_te_matrix_sft_answers/te_matrix_local:local-moe,local-init-from-hf > "$out/te_rows.log" 2>&1
    echo "te_matrix exit $? $(date -u +%T)"; tail -n 4 "$out/te_rows.log"
    rm -rf runs/te runs/te-hf ;;
  peers)
    te_on
    b=$(left)
    echo "profile: budget ${b}s $(date -u +%T)"
    BUDGET_S=$(( b < 100 ? b : 100 )) bash bench/gpu/te_calibration.sh "$out/prof" --profile --only te-fp8-delayed-mb8 \
      --dest .device/teprof --repeats 0 --min-start-s 80 > "$out/prof.log" 2>&1
    echo "profile exit $? $(date -u +%T)"; tail -n 3 "$out/prof.log"
    rm -rf .device/runs
    b=$(left)
    echo "peers: budget ${b}s $(date -u +%T)"
    MEGATRON_VARIANTS=${MEGATRON_VARIANTS:-te-fp8} MEGATRON_MBS=${MEGATRON_MBS:-12} HF_IMPLS=${HF_IMPLS:-liger,liger-compile-fp8} \
      WHL=.whl/peer BUDGET_S=$b bash bench/gpu/peers.sh "$out/peers" > "$out/peers.log" 2>&1
    echo "peers exit $? $(date -u +%T)"; grep -h "tokens/s\|ratio" "$out/peers.log" | tail -n 12
    rm -rf /tmp/peers-work
    rm -rf .device/runs ;;
  rows)
    te_on
    rows ;;
esac
ls -R "$out" | head -40
exit_pack
