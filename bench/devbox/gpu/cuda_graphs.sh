#!/usr/bin/env bash
# One GPU call (at most END_S = 200 s on one H100 after bench/devbox/install.sh, ~40 s): the sampler's model forward as CUDA
# graphs ([generate] cuda_graph, backends/generate/cuda_graphs.py) beside the eager forward, and the RL
# rollout's tokens/s beside d1's loop on a quickly made checkpoint.
#
#   1. bench/sampling/host_overhead.py --cuda-graph --d1-loop at batch 1 and at batch 128 (the 153M demo
#      model's shape, bf16, random weights): eager and CUDA graphs side by side in one process, per path
#      (none / prefix / dual cache, threshold, the RL rollout's sampling), wall ms per step, tokens/s, the
#      tokens compared (the script exits 1 when they differ), and d1's loop around the same model's eager
#      forward on the rollout settings.  -> $OUT/host-graphs-b1.json, $OUT/host-graphs-b128.json
#   2. (when at least ROLLOUT_MIN_S are left and .bench-peers holds LLaDA's modelling files) a checkpoint in
#      about a minute: the addition task (small), specs/task-addition-dlm.toml trained TRAIN_ITERS steps
#      (q/k norm off, as d1's LLaDA modelling code has none), specs/task-addition-dlm-rl.toml compiled
#      from it (its [stage.rl] and [generate]: the rollout batch, 16 prompts x G 8); then
#      bench/sampling/d1_rollout.py dlmspec (RolloutEngine.sample, CUDA graphs on: the spec's default),
#      d1 (d1's loop on the LLaDA export, transformers 4.49.0 from .bench-peers/wheels) and report.
#      The model is barely trained (speed only; its rollout accuracy means nothing).  -> $OUT/rollout-bench.json
#   Logs of every step: $OUT/cuda-graphs-logs.tgz.
#
#   bash bench/devbox/install.sh && export PYTHONPATH=/tmp/bench-site PATH=/tmp/bench-site/bin:$PATH \
#     && OUT=$OUT bash bench/devbox/gpu/cuda_graphs.sh        # carry .bench-wheels .bench-peers .bench-data
#   bash bench/devbox/gpu/cuda_graphs.sh --dry                # CPU: step 1 on a tiny model with the CPU
#                                                             # stand-in of a graph, step 2 up to the compiles
#
# The code run is this checkout's (laid out as the installed package, first on the path), not the carried
# dlmspec wheel. Settings (environment): END_S (200: every step ends by then), TRAIN_ITERS (10),
# ROLLOUT_MIN_S (100), REPEATS (6: timed calls per path), BATCHES ("1 128": step 1's batch sizes), PROFILE
# (0; 1: step 1 also profiles one call per path and sampler, host_overhead.py --profile: the GPU's busy time
# per step and the costliest kernels and host ops). Where a step's time goes at batch 32, alone (not yet timed):
#   BATCHES=32 PROFILE=1 ROLLOUT_MIN_S=100000 END_S=120 OUT=$OUT bash bench/devbox/gpu/cuda_graphs.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
repo=$PWD
dry=0
for a in "$@"; do [ "$a" = --dry ] && dry=1; done
OUT=${OUT:-/tmp/bench-out}
END_S=${END_S:-200}
TRAIN_ITERS=${TRAIN_ITERS:-10}
ROLLOUT_MIN_S=${ROLLOUT_MIN_S:-100}
REPEATS=${REPEATS:-6}
BATCHES=${BATCHES:-1 128}
PROFILE=${PROFILE:-0}
for v in END_S TRAIN_ITERS ROLLOUT_MIN_S REPEATS PROFILE; do
  case "${!v}" in ''|*[!0-9]*) echo "cuda_graphs.sh: $v=${!v} is not a whole number" >&2; exit 2 ;; esac
done
for b in $BATCHES; do
  case "$b" in ''|*[!0-9]*|0) echo "cuda_graphs.sh: BATCHES=\"$BATCHES\": whole numbers >= 1, e.g. BATCHES=\"1 128\"" >&2; exit 2 ;; esac
done
profile=()
[ "$PROFILE" = 1 ] && profile=(--profile)
START=$(date +%s)
deadline=$(( START + END_S - 10 ))
mkdir -p "$OUT"
logs=/tmp/cuda-graphs-logs
[ "$dry" = 1 ] && logs=$OUT/dry-logs
rm -rf "$logs" && mkdir -p "$logs"
log() { echo "[cuda-graphs +$(( $(date +%s) - START ))s] $*" | tee -a "$logs/steps.log"; }
left() { echo $(( deadline - $(date +%s) )); }
limit() { local want=$1 l; l=$(( $(left) - 5 )); echo $(( want < l ? want : l )); }
step() {  # step NAME LIMIT CMD...: CMD under timeout, its output in LOGS/NAME.log, skipped with under 5 s
  local name=$1 lim=$2 t rc
  shift 2
  if [ "$lim" -lt 5 ]; then log "$name: skipped, ${lim}s left"; return 124; fi
  t=$(date +%s)
  timeout -s TERM -k 10 "$lim" "$@" > "$logs/$name.log" 2>&1
  rc=$?
  log "$name exit $rc after $(( $(date +%s) - t ))s (limit ${lim}s)"
  return $rc
}
finish() {
  trap - EXIT
  tar czf "$OUT/cuda-graphs-logs.tgz" -C "$logs" . 2>/dev/null
  log "done; $OUT: $(ls "$OUT" | tr '\n' ' ')"
}
trap finish EXIT

src=/tmp/cuda-graphs-src
[ "$dry" = 1 ] && src=$OUT/dry-src
. bench/devbox/gpu/package_src.sh  # this checkout as the installed package, first on the path
package_src "$src" "$dry"
if [ "$dry" = 1 ]; then
  host=(--dry --device cpu --stand-in-graphs)
else
  host=(--device cuda --bf16 --layers 12 --hidden 768 --heads 12 --vocab 50304 --repeats "$REPEATS")
fi
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1 DLMSPEC_PYTHON=$PY

# 1. eager and CUDA graphs side by side, batch 1 and 128 (BATCHES)
paths=rl,low_confidence,threshold,low_confidence_prefix,low_confidence_dual
for b in $BATCHES; do
  step "host-b$b" "$(limit 80)" "$PY" "$repo/bench/sampling/host_overhead.py" "${host[@]}" --batch "$b" --cuda-graph \
    --d1-loop "${profile[@]}" --paths "$paths" --out "$OUT/host-graphs-b$b.json"
  grep -h "eager\|d1 loop\|differ\|profiled" "$logs/host-b$b.log"
done

# 2. the RL rollout beside d1's loop on a checkpoint made in about a minute
peers=$repo/.bench-peers
gpt2=$repo/.bench-data/gpt2
[ -f "$gpt2/vocab.json" ] || gpt2=${GPT2_DIR:-/work/main/.bench-data/gpt2}
if [ ! -f "$gpt2/vocab.json" ]; then log "no GPT-2 BPE files (carry .bench-data): rollout benchmark skipped"; exit 0; fi
if [ "$dry" = 0 ] && { [ ! -f "$peers/fast-dllm/llada/model/modeling_llada.py" ] || [ "$(left)" -lt "$ROLLOUT_MIN_S" ]; }; then
  log "rollout benchmark skipped: $(left)s left (needs $ROLLOUT_MIN_S), or no LLaDA modelling files under $peers"
  exit 0
fi
work=/tmp/cuda-graphs-rl
[ "$dry" = 1 ] && work=$OUT/dry-work
rm -rf "$work" && mkdir -p "$work/.data" && cp -r specs "$work/specs" && cp -r "$gpt2" "$work/.data/gpt2"
cd "$work"
step task "$(limit 30)" "$PY" -m dlmspec.cli task make addition-padded --out .data/task-addition --digits 3 \
  --train 4000 --valid 500 --test 500 || exit 1
for s in train validation; do
  step "data-$s" "$(limit 30)" "$PY" -m dlmspec.cli data prepare --input ".data/task-addition/pretrain-$s.jsonl" \
    --output-prefix ".data/task-addition-${s/validation/valid}" --tokenizer-type GPT2BPETokenizer \
    --vocab-file .data/gpt2/vocab.json --merge-file .data/gpt2/merges.txt --append-eod --workers 4 || exit 1
done
GPU=h100
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in *H200*) GPU=h200 ;; esac
common=(--set cluster.gpus_per_node=1 --set "cluster.gpu=\"$GPU\"" --set model.qk_layernorm=false)
step compile-task "$(limit 40)" "$PY" -m dlmspec.cli compile specs/task-addition-dlm.toml -o job-task --force --python "$PY" \
  "${common[@]}" --set train.train_iters="$TRAIN_ITERS" --set train.lr_warmup_iters=1 \
  --set checkpoint.save_interval="$TRAIN_ITERS" --set train.eval_interval="$TRAIN_ITERS" --set train.eval_iters=1 \
  --set eval.generation.max_prompts=8 || exit 1
step compile-rl "$(limit 40)" "$PY" -m dlmspec.cli compile specs/task-addition-dlm-rl.toml -o job-rl --force --python "$PY" \
  "${common[@]}" --set 'checkpoint.init_from="mcore:runs/task-addition-dlm/checkpoints"' || exit 1
if [ "$dry" = 1 ]; then
  log "dry: on the GPU: bash job-task/launch.sh; d1_rollout.py dlmspec --ckpt runs/task-addition-dlm/checkpoints --job job-rl;" \
      "transformers 4.49.0 into peer-site; d1_rollout.py d1; d1_rollout.py report"
  exit 0
fi
step train-task "$(limit 75)" bash job-task/launch.sh
bench=$repo/bench/sampling/d1_rollout.py
step bench-dlmspec "$(limit 60)" "$PY" "$bench" dlmspec --ckpt runs/task-addition-dlm/checkpoints --job job-rl --work d1 \
  --out "$logs/rollout-dlmspec.json" --llada-out d1/llada --device cuda --repeats 3 \
&& step peer-install "$(limit 30)" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target peer-site --find-links "$peers/wheels" "transformers==4.49.0" "tokenizers<0.22" "huggingface-hub<1.0" \
&& PYTHONPATH=$PWD/peer-site:$PYTHONPATH step bench-d1 "$(limit 60)" "$PY" "$bench" d1 --work d1 --llada d1/llada \
  --fast-dllm "$peers/fast-dllm" --out "$logs/rollout-d1.json" --device cuda --repeats 3
step bench-report 20 "$PY" "$bench" report --work d1 --parts "$logs/rollout-dlmspec.json" "$logs/rollout-d1.json" \
  --out "$OUT/rollout-bench.json"
exit 0
