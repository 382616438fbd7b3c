#!/usr/bin/env bash
# "make it fast": the megatron side against the strong Hugging Face peers, in ONE run on one
# H200, each job a fresh process (bench/throughput/run.py), within BUDGET_S (default 420 s) in all.
#   megatron: the compiled Qwen3-1.7B DLM spec (bench/throughput/qwen3-1.7b-mdm.toml, seq 4096, mock data)
#             on the Transformer Engine path, precision.fp8 = "hybrid" (te-fp8) and bf16 (te-bf16),
#             micro batches 8 and 12;
#   HF:       hf_baseline.py --impl liger, liger-compile-fp8, liger-compile at micro batch 12, and the plain
#             loop (today's row) at micro batch PLAIN_MBS (default 6, its best: full fp32 logits);
#   3 warm-up + 5 timed steps per job, ACCUM microbatches per optimizer step (default 1).
#   MEGATRON_VARIANTS (default te-fp8,te-bf16) and MEGATRON_MBS (default 8,12) narrow the megatron side, HF_IMPLS
#   (default liger,liger-compile-fp8,liger-compile,plain) the HF side
#   (an earlier GPU run: te-fp8 only, its bf16 rows measured minutes before by te_calibration.sh on the same machine).
# Jobs alternate between the sides in that order, so a budget that runs out still leaves both sides (and
# the fp8 rows) measured. Reported (OUT/throughput_<date>_peers.json, its "ratios" key): TE fp8 / strongest
# HF bf16, TE fp8 / HF fp8, bf16 megatron / fastest HF bf16, every variant/impl pair; tokens/s, MFU, peak
# allocated + reserved per job.
#
# GPU (from the repository root; TE in /tmp/site_te first on PYTHONPATH, megatron-core + dlmspec on it by
# the lead's wrapper; carry .whl/peer with the two wheels below):
#   export PYTHONPATH=/tmp/site_te:$PYTHONPATH PYTHONUNBUFFERED=1; bash bench/devbox/gpu/peers.sh $OUT
# CPU: bash bench/devbox/gpu/peers.sh --dry      (run.py --dry-run: compiles every megatron job, checks its
#                                          train.py, tries every import; WHL=/work/main/.whl/peer)
# The wheels (Liger Kernel 0.8.5, torchao 0.18.0) go into /tmp/peer with pip --no-index --no-deps --target
# (the GPU machine has no registry), appended to PYTHONPATH. $OUT gets the JSON, run.py's combined log
# and peers_install.log.
set -u
cd "$(dirname "$0")/../../.." || exit 2
PY=${PY:-python3}
DRY=0
if [ "${1:-}" = "--dry" ]; then
  DRY=1
  shift
  [ -x .venv/bin/python ] && PY=.venv/bin/python
  out=${OUT:-/tmp/peers-dry}
else
  out=${1:?usage: peers.sh OUT | peers.sh --dry}
  shift
fi
BUDGET_S=${BUDGET_S:-420}
ACCUM=${ACCUM:-1}
PLAIN_MBS=${PLAIN_MBS:-6}
WHL=${WHL:-.whl/peer}
SITE=${SITE:-/tmp/peer}
t0=$(date +%s)
mkdir -p "$out" "$SITE"

wheels=$(ls "$WHL"/liger_kernel-*.whl "$WHL"/torchao-*.whl 2>/dev/null)
{
  echo "peers.sh: wheels from $WHL: ${wheels:-none}"
  if [ -n "$wheels" ]; then
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" $wheels \
      && echo "peers.sh: installed into $SITE" || echo "peers.sh: pip install into $SITE FAILED"
  else
    echo "peers.sh: no wheels: the liger* impls are recorded as not importable"
  fi
} > "$out/peers_install.log" 2>&1
cat "$out/peers_install.log"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$SITE PYTHONUNBUFFERED=1

# shellcheck disable=SC2054 # the commas separate run.py's list values, not array elements
args=(--out "$out" --work-dir /tmp/peers-work --tag peers
      --megatron-variants "${MEGATRON_VARIANTS:-te-fp8,te-bf16}" --megatron-micro-batch-sizes "${MEGATRON_MBS:-8,12}"
      --hf-impls "${HF_IMPLS:-liger,liger-compile-fp8,liger-compile,plain}" --hf-micro-batch-sizes 12
      --hf-impl-micro-batch-sizes "plain=$PLAIN_MBS"
      --warmup 3 --steps 5 --microbatches-per-step "$ACCUM" --timeout-s "${JOB_TIMEOUT_S:-150}")
if [ "$DRY" = 1 ]; then
  exec "$PY" bench/throughput/run.py --dry-run "${args[@]}" "$@"
fi
left=$(( BUDGET_S - ($(date +%s) - t0) - 10 ))
# run.py stops starting jobs when < 60 s are left and kills the job at its limit; the outer timeout
# (SIGTERM: run.py writes what it measured) is the last resort
timeout -s TERM -k 5 $(( left + 5 )) "$PY" bench/throughput/run.py "${args[@]}" --budget-s "$left" "$@"
rc=$?
echo "peers.sh: run.py exit $rc after $(( $(date +%s) - t0 )) s; results in $out"
exit $rc
