#!/usr/bin/env bash
# The RL step time of all three algorithms in one GPU call (run by `bash bench/devbox/gpu.sh rl-step-time`; about
# 6 minutes on one H100 or H200, gpu.sh's install included): planned against measured on one host, the planner's
# one rule for diffu-GRPO, coupled-GRPO and AR GRPO. No accuracy is measured here (that is task_rl.sh's chain, one
# algorithm a call); the step's work does not depend on what the model learned, except that the AR sampler stops
# once every row has emitted EOS, which a model trained this briefly never does: its rollouts run all gen_length
# steps, the count the planner prices.
#
#   1. the addition task (`dlmspec task make`, TRAIN_ROWS rows) and its pre-training text, tokenised;
#   2. the task models (specs/task-addition-dlm.toml and -ar.toml) trained TASK_ITERS steps side by side: the
#      checkpoints RL starts from;
#   3. per algorithm, one after another: the bundled RL spec (specs/task-addition-dlm-rl.toml, -rl-coupled.toml,
#      -ar-rl.toml) compiled for the GPU present from that checkpoint, RL_ITERS steps logged every 2 (a log interval
#      is one rollout batch and its two updates), then `dlmspec plan` of the same job at the host's measured
#      kernel-launch time (the run's host_launch events: bench/sampling/rl_chain.py host-launch);
#   4. bench/sampling/rl_step_time.py summary: per algorithm the plan (at the calibration's and the host's launch
#      time) against the median measured step, and the rollout and update parts apart.
#
#   bash bench/devbox/gpu.sh rl-step-time          # GPU machine; carry .bench-wheels .bench-data
#   bash bench/devbox/gpu.sh rl-step-time --dry    # CPU: the task, the data, every compile and plan, the summary
#
# What comes back in $OUT: rl-step-time.json (the summary) and rl-step-time-logs.tgz (every log, each run's
# metrics.jsonl, the plans), written on every exit. Settings (environment): TRAIN_ROWS (20000), TASK_ITERS (20),
# RL_ITERS (40), ALGOS ("diffu-grpo coupled-grpo grpo"), GPU (h100/h200: nvidia-smi's), END_S (570: everything is
# written by GPU_SH_START + END_S).
set -uo pipefail
cd "$(dirname "$0")/../../.." || exit 2
repo=$PWD
dry=0
for a in "$@"; do [ "$a" = --dry ] && dry=1; done
OUT=${OUT:-/tmp/bench-out}
TRAIN_ROWS=${TRAIN_ROWS:-20000}
TASK_ITERS=${TASK_ITERS:-20}
RL_ITERS=${RL_ITERS:-40}
ALGOS=${ALGOS:-diffu-grpo coupled-grpo grpo}
END_S=${END_S:-570}
START=${GPU_SH_START:-$(date +%s)}
for v in TRAIN_ROWS TASK_ITERS RL_ITERS END_S START; do
  case "${!v}" in ''|*[!0-9]*) echo "rl_step_time.sh: $v=${!v} is not a whole number" >&2; exit 2 ;; esac
done
[ "$RL_ITERS" -ge 8 ] && [ "$TASK_ITERS" -ge 2 ] \
  || { echo "rl_step_time.sh: RL_ITERS must be at least 8 (the first log interval is left out) and TASK_ITERS at least 2" >&2; exit 2; }
. bench/devbox/gpu/task_steps.sh
for algo in $ALGOS; do
  rl_job "$algo" \
    || { echo "rl_step_time.sh: ALGOS holds $algo, not an RL algorithm; e.g. ALGOS=\"diffu-grpo coupled-grpo grpo\"" >&2; exit 2; }
done
deadline=$(( START + END_S - 30 ))  # every step ends by then; the last 30 s: summary and tarball
mkdir -p "$OUT"
logs=${LOGS:-/tmp/rl-step-time-logs}
[ "$dry" = 1 ] && logs=$OUT/dry-logs
rm -rf "$logs" && mkdir -p "$logs"
log() { echo "[rl-step-time +$(( $(date +%s) - START ))s] $*" | tee -a "$logs/steps.log"; }
left() { echo $(( deadline - $(date +%s) )); }
# step NAME LIMIT CMD...: CMD under `timeout` (SIGTERM at LIMIT s), its output in LOGS/NAME.log; skipped under 5 s
step() {
  local name=$1 limit=$2 t rc
  shift 2
  [ "$limit" -ge 5 ] || { log "$name: skipped, ${limit}s left"; return 124; }
  t=$(date +%s)
  timeout -s TERM -k 15 "$limit" "$@" > "$logs/$name.log" 2>&1
  rc=$?
  log "$name exit $rc after $(( $(date +%s) - t ))s (limit ${limit}s)"
  return $rc
}
limit() { local want=$1 l; l=$(( $(left) - 10 )); echo $(( want < l ? want : l )); }

src=${SRC:-/tmp/rl-step-time-src}
[ "$dry" = 1 ] && src=$OUT/dry-src
. bench/devbox/gpu/package_src.sh
package_src "$src" "$dry"
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1 DLMSPEC_PYTHON=$PY
work=${WORK:-/tmp/rl-step-time}
[ "$dry" = 1 ] && work=$OUT/dry-work
rm -rf "$work" && mkdir -p "$work/.data"
cp -r specs "$work/specs"
gpt2=.bench-data/gpt2
[ -f "$gpt2/vocab.json" ] || gpt2=${GPT2_DIR:-/work/main/.bench-data/gpt2}
GPU=${GPU:-$(gpu_id)}
common=(--set cluster.gpus_per_node=1 --set "cluster.gpu=\"$GPU\"")

finish() {
  trap - EXIT
  cd "$work" 2>/dev/null || cd "$repo" || return
  timeout 20 "$PY" "$repo/bench/sampling/rl_step_time.py" --logs "$logs" --algos "$ALGOS" --gpu "$GPU" \
    --out "$OUT/rl-step-time.json" --field "dry=$dry" --field "rl_iters=$RL_ITERS" --field "task_iters=$TASK_ITERS" \
    > "$logs/summary.log" 2>&1
  log "summary exit $?"
  cat "$logs/summary.log"
  tar czf "$OUT/rl-step-time-logs.tgz" -C "$logs" . 2>/dev/null
  log "done; $OUT: $(ls "$OUT" | tr '\n' ' ')"
}
trap finish EXIT

cp -r "$gpt2" "$work/.data/gpt2" || { log "no GPT-2 BPE files (carry .bench-data)"; exit 2; }
cd "$work" || exit 2
log "on $GPU: task model $TASK_ITERS steps, RL $RL_ITERS steps of: $ALGOS"

# 1. the task and its pre-training text
task_text addition-padded 3 500 "$TRAIN_ROWS" 4 || exit 2

# 2. the task models, side by side (no held-out scoring: eval_interval past the run)
models=()
for algo in $ALGOS; do rl_job "$algo"; models+=("$model"); done
mapfile -t models < <(printf '%s\n' "${models[@]}" | sort -u)
pids=()
for m in "${models[@]}"; do
  sets=("${common[@]}" --set train.train_iters="$TASK_ITERS" --set train.lr_warmup_iters=1 --set train.lr_decay_iters="$TASK_ITERS"
        --set checkpoint.save_interval="$TASK_ITERS" --set train.eval_interval="$(( TASK_ITERS + 1 ))")
  [ "$m" = dlm ] && sets+=(--set model.qk_layernorm=false)
  step "compile-task-$m" "$(limit 60)" "$PY" -m dlmspec.cli compile "specs/task-addition-$m.toml" -o "job-task-$m" --force \
    --python "$PY" "${sets[@]}" || exit 2
  if [ "$dry" = 0 ]; then
    step "train-task-$m" "$(limit 150)" bash "job-task-$m/launch.sh" &
    pids+=($!)
  fi
done
for p in ${pids[@]+"${pids[@]}"}; do wait "$p" || log "a task model's training exited non-zero (train-task-*.log)"; done

# 3. RL, one algorithm after another
for algo in $ALGOS; do
  rl_job "$algo"
  spec=$rl_spec run=$rl_name m=$model
  sets=("${common[@]}" --set train.train_iters="$RL_ITERS" --set checkpoint.save_interval="$RL_ITERS" --set logging.log_interval=2
        --set train.eval_interval="$RL_ITERS" --set 'train.lr_decay_style="constant"'
        --set "checkpoint.init_from=\"mcore:runs/task-addition-$m/checkpoints\"")
  [ "$m" = dlm ] && sets+=(--set model.qk_layernorm=false)
  mkdir -p "$logs/$algo"
  printf '%s\n' "${sets[@]}" > "$logs/$algo/overrides.txt"
  step "compile-$algo" "$(limit 60)" "$PY" -m dlmspec.cli compile "$spec" -o "job-$algo" --force --python "$PY" "${sets[@]}" \
    || continue
  cp "job-$algo/plan.json" "$logs/$algo/plan.json"
  if [ "$dry" = 0 ]; then
    step "train-$algo" "$(limit 170)" bash "job-$algo/launch.sh"
    cp "runs/$run/metrics.jsonl" "$logs/$algo/metrics.jsonl" 2>/dev/null
    host_us=$(timeout 10 "$PY" "$repo/bench/sampling/rl_chain.py" host-launch --metrics "runs/$run/metrics.jsonl" 2>/dev/null)
  else
    host_us=7.2  # a dry run measures nothing: the plan at a stand-in launch time, so the command is exercised
  fi
  if [ -n "$host_us" ]; then
    timeout 30 "$PY" -m dlmspec.cli plan "$spec" "${sets[@]}" --set "cluster.host_launch_us=$host_us" --json \
      > "$logs/$algo/plan-host.json" 2> "$logs/$algo/plan-host.log"
    log "$algo: plan at the host's $host_us us a launch exit $?"
  fi
  rm -rf "runs/$run/checkpoints"  # the checkpoint is not needed; the disk is
done
exit 0
