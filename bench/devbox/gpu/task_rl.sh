#!/usr/bin/env bash
# One GPU call per RL algorithm (run by `bash bench/devbox/gpu.sh rl-diffu-grpo|rl-coupled-grpo|rl-grpo`, or
# `ALGO=... bash bench/devbox/gpu.sh task-rl`; at most 9 minutes on one H100 or H200, gpu.sh's install of
# ~40 s included): the addition task's model trained in the same call, its held-out accuracy, the RL stage,
# the held-out accuracy after it, and, for the masked-diffusion algorithms, rollout tokens/s beside d1's loop.
#
#   ALGO=diffu-grpo    specs/task-addition-dlm.toml (TRAIN_ITERS) -> specs/task-addition-dlm-sft.toml (SFT_ITERS)
#   ALGO=coupled-grpo    -> specs/task-addition-dlm-rl.toml / -rl-coupled.toml from the SFT model (the specs'
#                           chat template "plain", as it was tuned), then bench/sampling/d1_rollout.py on the RL checkpoint
#   ALGO=grpo          specs/task-addition-ar.toml (TRAIN_ITERS) -> specs/task-addition-ar-rl.toml
#
#   bash bench/devbox/gpu.sh rl-diffu-grpo          # GPU machine; carry .bench-wheels .bench-data .bench-peers
#   bash bench/devbox/gpu.sh rl-diffu-grpo --dry    # CPU: the task, the data, every compile and plan, the summary
#
# The model RL starts from: of the starting run's checkpoints, each scored in training on the validation prompts,
# the latest with accuracy in [START_ACC_MIN, START_ACC_MAX] (0.2 and 0.75: RL needs room above the start and
# groups whose completions are sometimes right; bench/sampling/rl_chain.py pick-start). When none lies there
# the call stops (exit 3, summary and logs written) rather than train RL from ~0 %: score more often.
# Held-out accuracy: `dlmspec eval CHECKPOINT --task test file --spec TASK_SPEC` of that model and of the
# RL run, EVAL_PROMPTS prompts each, greedy (the task spec's [generate]: the RL run's own [generate] samples
# at temperature 1 for its rollouts); the criterion is after above before with Wilson 95 % intervals apart.
# The scoring of the starting model runs beside the RL run's start (its first steps are left out of the
# measured step time). Planned RL step time: the compiled RL job's plan.json (for the GPU nvidia-smi names);
# measured: the median step_time_s of its metrics.jsonl (bench/sampling/rl_chain.py).
#
# What comes back in $OUT (at most 8 files): summary.json (bench/sampling/rl_chain.py), task-rl-ALGO-reward-kl.png
# (`dlmspec plot` of the RL run: reward and KL beside loss and tokens/s), task-rl-ALGO-logs.tgz (every log, the
# runs' metrics.jsonl, the eval JSONs, the plans, rollouts.jsonl, the rollout benchmark's JSONs), and gpu.sh's
# install.log. They are written on every exit, a failed or skipped step included. Without matplotlib on the GPU
# machine there is no PNG (plot.log says so): draw it from the tarball's metrics-rl.jsonl with
#   mkdir -p rl-run && cp metrics-rl.jsonl rl-run/metrics.jsonl && dlmspec plot rl-run -o reward-kl.png
#
# Time: everything is written by START + END_S (570 s after gpu.sh started, START = GPU_SH_START): every step
# runs under `timeout` with what is left, training runs save a checkpoint when stopped (SIGTERM; and half-way),
# the task model and its SFT stage are stopped early rather than leave RL less than its start-up and
# RL_MIN_ITERS steps, the RL run's iterations are fitted to the time left (its planned step time x 1.5: reward
# workers and host work are not planned), and the rollout benchmark is skipped when it no longer fits.
#
# Settings (environment): ALGO (diffu-grpo), TASK (addition-padded), DIGITS (3), TEST (2000 held-out rows),
# TRAIN_ROWS (200000: the task's training rows, its pre-training text and the RL prompts),
# EVAL_PROMPTS (2000: a Wilson interval of +-2.2 points at 50 %), TRAIN_ITERS (DLM 400, AR 600; ~0.1 s a step on an H100: bench/results/sampling),
# TASK_EVERY (the task model's save and scoring interval: DLM TRAIN_ITERS / 2, not a candidate; AR 50: on an H100
# the AR model went 0.7 % at iteration 250 to 82 % at 500, so only a fine interval leaves a candidate between),
# TASK_SCHEDULE_ITERS (AR: 1500, the length of its learning-rate schedule, cut at TRAIN_ITERS), SFT_ITERS
# (1200: on an H100 the SFT model's accuracy rose from under 1 % to 83 % between iterations 600 and 900),
# SFT_EVERY (100: its checkpoints, each scored, are the candidates RL may start from; coarser ones may
# skip every start between ~0 % and 75 %), RL_ITERS (200 at most; 2 steps a rollout batch), RL_MIN_ITERS (100), RL_LR (the spec's 5e-5; AR
# GRPO at 1e-4 and 2e-4 lowered held-out accuracy, see below), RL_SET (more KEY=VALUE overrides of the
# RL job, space-separated, recorded like the rest: e.g. RL_SET="stage.rl.grpo_group_size=16
# stage.rl.grpo_prompts_per_step=8 stage.rl.filter_groups=true"), GPU (h100/h200: nvidia-smi's),
# END_S (570). Overrides of the bundled specs, all recorded in summary.json: one GPU and the GPU present; the
# masked-diffusion chain without q/k norm (model.qk_layernorm = false: LLaDA's modelling code, which d1's loop
# runs on the export, has none); the iteration counts and their warm-up, save and evaluation intervals; the RL
# run from the checkpoint picked (the RL specs start from the last one: the SFT run's for masked diffusion, with
# its "plain" template, the AR task model's for grpo), logged every 2 steps (a log interval is then one rollout
# batch and its second update), at a constant learning rate after its warm-up (d1: constant_with_warmup).
# The code run is this checkout's (laid out as the installed package in /tmp/task-rl-src), not the carried
# dlmspec wheel; the wheels give the dependencies.
set -uo pipefail
cd "$(dirname "$0")/../../.."
repo=$PWD
dry=0
for a in "$@"; do [ "$a" = --dry ] && dry=1; done
OUT=${OUT:-/tmp/bench-out}
ALGO=${ALGO:-diffu-grpo}
. bench/devbox/gpu/task_steps.sh
rl_job "$ALGO" \
  || { echo "task_rl.sh: ALGO=$ALGO is not an RL algorithm; use ALGO=diffu-grpo, coupled-grpo or grpo" >&2; exit 2; }
TASK=${TASK:-addition-padded}
DIGITS=${DIGITS:-3}
TEST=${TEST:-2000}
TRAIN_ROWS=${TRAIN_ROWS:-200000}
EVAL_PROMPTS=${EVAL_PROMPTS:-2000}
if [ "$model" = dlm ]; then TRAIN_ITERS=${TRAIN_ITERS:-400}; else TRAIN_ITERS=${TRAIN_ITERS:-600}; fi
SFT_ITERS=${SFT_ITERS:-1200}
SFT_EVERY=${SFT_EVERY:-100}  # the SFT run's save and scoring interval: the candidates RL may start from
[ "$model" = ar ] && TASK_EVERY=${TASK_EVERY:-50}  # the DLM's default (TRAIN_ITERS / 2) once TRAIN_ITERS is checked
RL_ITERS=${RL_ITERS:-200}
RL_MIN_ITERS=${RL_MIN_ITERS:-100}
RL_LR=${RL_LR:-}
# AR GRPO on one H100 (bench/results/rl/2026-12-07-h100-grpo-ar-*.json, docs/rl.md): at the RL specs' 5e-5 held-out
# accuracy did not move (65.3 -> 65.9 %); at 2e-4 it fell (74.5 -> 56.0 %), at 1e-4 too (55.9 -> 47.9 %). So every
# chain runs at the spec's rate unless RL_LR is given.
START_ACC_MAX=${START_ACC_MAX:-0.75}
START_ACC_MIN=${START_ACC_MIN:-0.2}
[[ "$START_ACC_MAX" =~ ^(0(\.[0-9]+)?|1(\.0+)?)$ ]] \
  || { echo "task_rl.sh: START_ACC_MAX=$START_ACC_MAX is not a share in [0, 1], e.g. 0.75" >&2; exit 2; }
[[ "$START_ACC_MIN" =~ ^(0(\.[0-9]+)?|1(\.0+)?)$ ]] \
  || { echo "task_rl.sh: START_ACC_MIN=$START_ACC_MIN is not a share in [0, 1], e.g. 0.2" >&2; exit 2; }
END_S=${END_S:-570}
START=${GPU_SH_START:-$(date +%s)}
for v in TEST TRAIN_ROWS EVAL_PROMPTS TRAIN_ITERS SFT_ITERS SFT_EVERY RL_ITERS RL_MIN_ITERS END_S START DIGITS; do
  case "${!v}" in ''|*[!0-9]*) echo "task_rl.sh: $v=${!v} is not a whole number" >&2; exit 2 ;; esac
done
TASK_EVERY=${TASK_EVERY:-$(( TRAIN_ITERS / 2 ))}
TASK_SCHEDULE_ITERS=${TASK_SCHEDULE_ITERS:-1500}
case "$TASK_SCHEDULE_ITERS" in ''|*[!0-9]*|0) echo "task_rl.sh: TASK_SCHEDULE_ITERS=$TASK_SCHEDULE_ITERS is not a positive whole number" >&2; exit 2 ;; esac
case "$TASK_EVERY" in ''|*[!0-9]*) echo "task_rl.sh: TASK_EVERY=$TASK_EVERY is not a whole number" >&2; exit 2 ;; esac
[ "$TRAIN_ITERS" -ge 20 ] && [ "$SFT_ITERS" -ge 20 ] && [ "$SFT_EVERY" -ge 1 ] && [ "$TASK_EVERY" -ge 1 ] && [ "$RL_ITERS" -ge 4 ] \
  || { echo "task_rl.sh: TRAIN_ITERS and SFT_ITERS must be at least 20, SFT_EVERY and TASK_EVERY at least 1, RL_ITERS at least 4" >&2; exit 2; }
awk -v lo="$START_ACC_MIN" -v hi="$START_ACC_MAX" 'BEGIN { exit !(lo + 0 <= hi + 0) }' \
  || { echo "task_rl.sh: START_ACC_MIN=$START_ACC_MIN is above START_ACC_MAX=$START_ACC_MAX; e.g. 0.2 and 0.75" >&2; exit 2; }
deadline=$(( START + END_S - 35 ))  # every step ends by then; the last 35 s: summary, plot, tarball
t0=$(date +%s)
mkdir -p "$OUT"
logs=${LOGS:-/tmp/task-rl-logs}
[ "$dry" = 1 ] && logs=$OUT/dry-logs
rm -rf "$logs" && mkdir -p "$logs"
: > "$logs/steps.tsv"
log() { echo "[task-rl $ALGO +$(( $(date +%s) - START ))s] $*" | tee -a "$logs/steps.log"; }
left() { echo $(( deadline - $(date +%s) )); }

# step NAME LIMIT CMD...: CMD under `timeout` (SIGTERM at LIMIT s, SIGKILL 15 s later), its output in
# LOGS/NAME.log (stdout in the file STDOUT_TO instead, when set), its exit code and times in LOGS/steps.tsv;
# skipped (exit 124) with under 5 s.
step() {
  local name=$1 limit=$2 t rc
  shift 2
  t=$(date +%s)
  if [ "$limit" -lt 5 ]; then
    printf '%s\tskipped\t%s\t%s\n' "$name" "$t" "$t" >> "$logs/steps.tsv"
    log "$name: skipped, ${limit}s left"
    return 124
  fi
  if [ -n "${STDOUT_TO:-}" ]; then
    timeout -s TERM -k 15 "$limit" "$@" > "$STDOUT_TO" 2> "$logs/$name.log"
  else
    timeout -s TERM -k 15 "$limit" "$@" > "$logs/$name.log" 2>&1
  fi
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$t" "$(date +%s)" >> "$logs/steps.tsv"
  log "$name exit $rc after $(( $(date +%s) - t ))s (limit ${limit}s)"
  return $rc
}
limit() { local want=$1 l; l=$(( $(left) - 15 )); echo $(( want < l ? want : l )); }  # LIMIT for a step that wants $1 s

# this checkout as the installed package (package-dir of pyproject.toml), first on the path
src=${SRC:-/tmp/task-rl-src}
[ "$dry" = 1 ] && src=$OUT/dry-src
. bench/devbox/gpu/package_src.sh
package_src "$src" "$dry"
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1 DLMSPEC_PYTHON=$PY
dl() { "$PY" -m dlmspec.cli "$@"; }

work=${WORK:-/tmp/task-rl}
[ "$dry" = 1 ] && work=$OUT/dry-work
rm -rf "$work" && mkdir -p "$work/.data"
cp -r specs "$work/specs"
gpt2=.bench-data/gpt2
[ -f "$gpt2/vocab.json" ] || gpt2=${GPT2_DIR:-/work/main/.bench-data/gpt2}
peers=$repo/.bench-peers
GPU=${GPU:-$(gpu_id)}

task_spec=specs/task-addition-$model.toml
test_file=.data/task-addition/test.jsonl
[ "$model" = dlm ] && test_file=.data/task-addition/test-plain.jsonl
start_run=runs/task-addition-$model
[ "$model" = dlm ] && start_run=runs/task-addition-dlm-sft
start_ckpt=$start_run/checkpoints  # the checkpoint RL starts from: picked after training (rl_chain.py pick-start)
overrides=()  # every --set given to a compile of the chain, for the summary

# the files that come back, on every exit (a failed step included): summary, plot, one tarball
finish() {
  trap - EXIT
  cd "$work" 2>/dev/null || cd "$repo"
  for kind in task sft rl; do
    case $kind in task) run=runs/task-addition-$model ;; sft) run=runs/task-addition-dlm-sft ;; rl) run=runs/$rl_name ;; esac
    cp "$run/metrics.jsonl" "$logs/metrics-$kind.jsonl" 2>/dev/null
  done
  cp "runs/$rl_name/rollouts.jsonl" "$logs/rollouts-rl.jsonl" 2>/dev/null
  for kind in task sft rl; do cp "job-$kind/plan.json" "$logs/plan-$kind.json" 2>/dev/null; done
  # the RL job planned again at this host's measured kernel-launch time (a small model's step follows the host)
  local host_us
  host_us=$(timeout 10 "$PY" "$repo/bench/sampling/rl_chain.py" host-launch --metrics "runs/$rl_name/metrics.jsonl" 2>/dev/null)
  if [ -n "$host_us" ] && [ -f job-rl/plan.json ]; then
    timeout 20 "$PY" -m dlmspec.cli plan "$rl_spec" ${rl_args[@]+"${rl_args[@]}"} --set "cluster.host_launch_us=$host_us" \
      --json > "$logs/plan-rl-host.json" 2> "$logs/plan-rl-host.log"
    log "plan at the host's ${host_us} us a launch exit $?"
  fi
  printf '%s\n' "${overrides[@]}" > "$logs/overrides.txt"
  local f=(gpu="$GPU" dry="$([ "$dry" = 1 ] && echo true || echo false)" task="$TASK" digits="$DIGITS"
           train_rows="$TRAIN_ROWS" held_out_rows="$TEST" eval_prompts="$EVAL_PROMPTS" train_iters="$TRAIN_ITERS"
           sft_iters="$([ "$model" = dlm ] && echo "$SFT_ITERS" || echo null)" sft_every="$([ "$model" = dlm ] && echo "$SFT_EVERY" || echo null)" rl_iters_asked="$RL_ITERS"
           rl_iters_run="${rl_iters:-null}" rl_lr="${RL_LR:-spec}" rl_spec="$rl_spec" task_spec="$task_spec"
           starting_model="$start_ckpt" start_accuracy_min="$START_ACC_MIN" start_accuracy_max="$START_ACC_MAX" task_every="$TASK_EVERY" seconds_since_start="$(( $(date +%s) - START ))")
  timeout 12 "$PY" "$repo/bench/sampling/rl_chain.py" summary --logs "$logs" --algo "$ALGO" --out "$OUT/summary.json" \
    "${f[@]/#/--field=}" > "$logs/summary.log" 2>&1
  log "summary exit $?"
  cat "$logs/summary.log"
  if [ -f "runs/$rl_name/metrics.jsonl" ]; then
    timeout 20 "$PY" -m dlmspec.cli plot "runs/$rl_name" -o "$OUT/task-rl-$ALGO-reward-kl.png" --force > "$logs/plot.log" 2>&1
    log "plot exit $? ($(tail -1 "$logs/plot.log"))"
  fi
  tar czf "$OUT/task-rl-$ALGO-logs.tgz" -C "$logs" . 2>/dev/null
  log "done; $OUT: $(ls "$OUT" | tr '\n' ' ')"
}
trap finish EXIT

cp -r "$gpt2" "$work/.data/gpt2" || { log "no GPT-2 BPE files (carry .bench-data: bench/devbox/fetch_fast_dllm.sh)"; exit 2; }
if [ "$model" = dlm ] && [ ! -f "$peers/fast-dllm/llada/model/modeling_llada.py" ]; then
  log "no LLaDA modelling files under $peers (carry .bench-peers: bench/devbox/fetch_fast_dllm.sh); the rollout benchmark will be skipped"
fi
cd "$work"  # the specs' relative paths (.data/..., runs/...) are from here
log "$ALGO on $GPU: task $TASK --digits $DIGITS; task model $TRAIN_ITERS iterations$([ "$model" = dlm ] && echo ", SFT $SFT_ITERS"), RL at most $RL_ITERS"

# 1. the task and its data
task_text "$TASK" "$DIGITS" "$TEST" "$TRAIN_ROWS" 8 || exit 2
if [ "$model" = dlm ]; then
  # the SFT stage's data (LLaDA's layout, the plain template; `dlmspec task make` wrote the held-out prompts
  # rendered with it, test-plain.jsonl and validation-plain.jsonl), tokenised in one process in the background
  # while the GPU trains (`task make --prepare-data` would write all four datasets before the first step)
  ( for s in train validation; do
      step "sft-data-$s" "$(limit 200)" "$PY" -m dlmspec.cli data prepare --sft --chat-template plain \
        --input ".data/task-addition/sft-$s.jsonl" --output-prefix ".data/task-addition-sft-${s/validation/valid}" \
        --tokenizer-type GPT2BPETokenizer --vocab-file .data/gpt2/vocab.json --merge-file .data/gpt2/merges.txt \
        --seq-length 24 || exit 1
    done ) &
  pid_sft_data=$!
fi

# 2. the jobs, compiled for the GPU present
common=(--set cluster.gpus_per_node=1 --set "cluster.gpu=\"$GPU\"")
[ "$model" = dlm ] && common+=(--set model.qk_layernorm=false)
# the learning-rate schedule of the task model: over TRAIN_ITERS, but the AR model's is the 1500-iteration one of
# its measured run (warm-up 100, cosine decay over 1500) cut at TRAIN_ITERS (600): the scores above were taken on it
schedule=$TRAIN_ITERS
[ "$model" = ar ] && schedule=$TASK_SCHEDULE_ITERS
warm=$(( schedule / 10 < 100 ? schedule / 10 : 100 ))
# The training runs are scored in training on the validation prompts (greedy), and save a checkpoint at each
# score: the starting run's checkpoints are the candidates RL may start from (rl_chain.py pick-start: the latest
# with validation accuracy in [START_ACC_MIN, START_ACC_MAX]). The DLM's pre-training (not a candidate) saves
# half-way; the AR model every TASK_EVERY (50) iterations.
every=$TASK_EVERY
task_sets=("${common[@]}" --set train.train_iters="$TRAIN_ITERS" --set train.lr_warmup_iters="$warm"
           --set train.lr_decay_iters="$schedule"
           --set checkpoint.save_interval="$every" --set train.eval_interval="$every"
           --set 'eval.generation.prompts=".data/task-addition/validation.jsonl"')
sft_sets=("${common[@]}" --set train.train_iters="$SFT_ITERS" --set checkpoint.save_interval="$SFT_EVERY"
          --set train.eval_interval="$SFT_EVERY"
          --set 'eval.generation.prompts=".data/task-addition/validation-plain.jsonl"')
rl_sets() {  # the RL job's --set for $1 iterations from the checkpoint $2
  local sets=("${common[@]}" --set train.train_iters="$1" --set checkpoint.save_interval="$1" --set logging.log_interval=2
              --set train.eval_interval="$1" --set 'train.lr_decay_style="constant"' --set "checkpoint.init_from=\"mcore:$2\"")
  [ -n "$RL_LR" ] && sets+=(--set "train.lr=$RL_LR")
  local kv
  for kv in ${RL_SET:-}; do sets+=(--set "$kv"); done  # RL_SET: more KEY=VALUE for the RL job, space-separated
  printf '%s\n' "${sets[@]}"
}
mapfile -t rl_args < <(rl_sets "$RL_ITERS" "$start_ckpt")
overrides=("task: ${task_sets[*]}" "rl: ${rl_args[*]}")
step compile-task "$(limit 60)" "$PY" -m dlmspec.cli compile "$task_spec" -o job-task --force --python "$PY" "${task_sets[@]}" &
pid_c1=$!
if [ "$model" = dlm ]; then
  overrides+=("sft: ${sft_sets[*]}")
  step compile-sft "$(limit 60)" "$PY" -m dlmspec.cli compile specs/task-addition-dlm-sft.toml -o job-sft --force \
    --python "$PY" "${sft_sets[@]}" &
  pid_c2=$!
fi
step compile-rl "$(limit 60)" "$PY" -m dlmspec.cli compile "$rl_spec" -o job-rl --force --python "$PY" "${rl_args[@]}"
rc_rl=$?
wait $pid_c1; rc_task=$?
rc_sft=0
[ "$model" = dlm ] && { wait $pid_c2; rc_sft=$?; }
[ $rc_task = 0 ] && [ $rc_sft = 0 ] && [ $rc_rl = 0 ] || { log "a compile failed (logs: compile-*.log)"; exit 2; }
planned=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["time"]["step_seconds"])' job-rl/plan.json)
log "compiled job-task$([ "$model" = dlm ] && echo " job-sft") job-rl; planned RL step ${planned}s on $GPU"

if [ "$dry" = 1 ]; then
  [ "$model" = dlm ] && { wait $pid_sft_data; log "sft data exit $?"; }
  step validate-rl 60 "$PY" -m dlmspec.cli validate "$rl_spec" "${rl_args[@]}"
  log "dry: on the GPU: bash job-task/launch.sh$([ "$model" = dlm ] && echo "; bash job-sft/launch.sh"); dlmspec eval" \
      "<the checkpoint of $start_run that rl_chain.py pick-start picks> --task $test_file --spec $task_spec beside" \
      "bash job-rl/launch.sh (init_from that checkpoint, iterations fitted to the time left); dlmspec eval runs/$rl_name" \
      "$([ "$model" = dlm ] && echo "; d1_rollout.py dlmspec, d1 (transformers 4.49.0 from .bench-peers/wheels), report")"
  exit 0
fi

# 3. the task model (and its SFT stage), stopped early rather than leave RL less than rl_min seconds (its
# start-up and RL_MIN_ITERS steps at 1.5 x the planned step) and what comes after it: the scoring after RL
# and, for masked diffusion, the rollout benchmark
after=45
[ "$model" = dlm ] && after=$(( after + 95 ))
rl_min=$("$PY" -c 'import sys; print(int(40 + 1.5 * float(sys.argv[1]) * int(sys.argv[2])))' "$planned" "$RL_MIN_ITERS")
sft_min=0
[ "$model" = dlm ] && sft_min=90
cap() { local want=$1 reserve=$2 l; l=$(( $(left) - reserve )); echo $(( want < l ? want : l )); }
step train-task "$(cap "$([ "$model" = dlm ] && echo 170 || echo 230)" $(( after + rl_min + sft_min )))" bash job-task/launch.sh
grep -h "generation accuracy" "$logs/train-task.log" | tail -2
if [ "$model" = dlm ]; then
  wait $pid_sft_data; log "sft data exit $?"
  step train-sft "$(cap 170 $(( after + rl_min )))" bash job-sft/launch.sh
  grep -h "generation accuracy" "$logs/train-sft.log" | tail -2
fi

# 4. RL from the checkpoint picked, its iterations fitted to the time left (start-up ~40 s; after it: the scoring
# and the rollout benchmark)
picked=$(timeout 30 "$PY" "$repo/bench/sampling/rl_chain.py" pick-start --run "$start_run" --min-accuracy "$START_ACC_MIN" \
  --max-accuracy "$START_ACC_MAX" --out "$logs/start.json" 2> "$logs/pick-start.log")
rc_pick=$?
if [ $rc_pick != 0 ] || [ -z "$picked" ]; then
  log "no start for RL (pick-start exit $rc_pick): $(tail -c 600 "$logs/pick-start.log")"
  start_ckpt=none
  exit 3
fi
start_ckpt=$picked
log "RL starts from $start_ckpt ($(tr -d '\n' < "$logs/start.json" 2>/dev/null | head -c 300))"
fit=$("$PY" -c 'import sys; left, p, cap = (float(a) for a in sys.argv[1:]); n = int((left - 40) / (1.5 * p)) // 2 * 2; print(max(4, min(int(cap), n)))' \
  "$(( $(left) - after ))" "$planned" "$RL_ITERS")
rl_iters=$fit
mapfile -t rl_args < <(rl_sets "$rl_iters" "$start_ckpt")
overrides[1]="rl: ${rl_args[*]}"
step compile-rl-fitted 30 "$PY" -m dlmspec.cli compile "$rl_spec" -o job-rl --force --python "$PY" "${rl_args[@]}"
log "rl: $rl_iters iterations (asked $RL_ITERS), $(left)s left"
STDOUT_TO=$logs/eval-before.json step eval-before "$(limit 90)" "$PY" -m dlmspec.cli eval "$start_ckpt" --task "$test_file" --max-prompts "$EVAL_PROMPTS" \
  --batch-size 500 --spec "$task_spec" --json &
pid_before=$!
step train-rl "$(( $(left) - after > 20 ? $(left) - after : 20 ))" bash job-rl/launch.sh
wait $pid_before
STDOUT_TO=$logs/eval-after.json step eval-after "$(limit 60)" "$PY" -m dlmspec.cli eval "runs/$rl_name" --task "$test_file" --max-prompts "$EVAL_PROMPTS" \
  --batch-size 500 --spec "$task_spec" --json

# 5. the rollout benchmark beside d1's loop (masked diffusion only), on the RL run's checkpoint (the starting
# model's when the RL run left none)
if [ "$model" = dlm ] && [ -f "$peers/fast-dllm/llada/model/modeling_llada.py" ] && [ "$(left)" -ge 60 ]; then
  bench=$repo/bench/sampling/d1_rollout.py
  bench_ckpt=runs/$rl_name/checkpoints
  ls "$bench_ckpt"/iter_*/dlmspec.json > /dev/null 2>&1 || bench_ckpt=$start_ckpt
  log "rollout benchmark on $bench_ckpt"
  step bench-dlmspec "$(limit 75)" "$PY" "$bench" dlmspec --ckpt "$bench_ckpt" --job job-rl --work d1 \
    --out "$logs/rollout-dlmspec.json" --llada-out d1/llada --device cuda --repeats 3 \
  && step peer-install "$(limit 40)" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target peer-site --find-links "$peers/wheels" "transformers==4.49.0" "tokenizers<0.22" "huggingface-hub<1.0" \
  && PYTHONPATH=$PWD/peer-site:$PYTHONPATH step bench-d1 "$(limit 60)" "$PY" "$bench" d1 --work d1 --llada d1/llada \
    --fast-dllm "$peers/fast-dllm" --out "$logs/rollout-d1.json" --device cuda --repeats 3
  step bench-report 30 "$PY" "$bench" report --work d1 --parts "$logs/rollout-dlmspec.json" "$logs/rollout-d1.json" \
    --out "$logs/rollout-bench.json"
elif [ "$model" = dlm ]; then
  log "rollout benchmark skipped: $(left)s left, or no LLaDA modelling files under $peers"
fi
exit 0
