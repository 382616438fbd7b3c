#!/usr/bin/env bash
# One GPU call (run by `bash bench/devbox/gpu.sh task-rl`, within 9 minutes on one H100): the addition
# task model, masked diffusion (specs/task-addition-dlm.toml) and its AR baseline (specs/task-addition-ar.toml),
# trained side by side on the one GPU and scored on the held-out prompts (`dlmspec eval --task`), then the RL
# stage (specs/task-addition-dlm-rl.toml, diffu-GRPO) on the trained DLM for RL_ITERS steps, its reward per step
# and the held-out accuracy before and after. Everything under $OUT: logs, metrics.jsonl of each run, the eval
# JSON of each model, and summary.json (what the report quotes).
#
#   bash bench/devbox/gpu.sh task-rl            # GPU machine; carry .bench-wheels .bench-data
#   bash bench/devbox/gpu.sh task-rl --dry      # CPU: the task, the data and every compile/validate step, no training
#
# Then the DLM's SFT stage (specs/task-addition-dlm-sft.toml: LLaDA's layout, prompt clean, answer masked) from
# its checkpoint, scored on the held-out prompts rendered with its template; RL starts from the SFT model
# (RL_FROM=dlm: from the pre-trained DLM).
# Settings (environment): TASK (addition-padded), DIGITS (3), TRAIN_ITERS (2000, the specs'), SFT_ITERS (1000),
# RL_ITERS (24), RL_FROM (sft), TEST (1000), EVAL_PROMPTS (500 scored per model), TRAIN_TIMEOUT (210 s for the
# two trainings together; a run stopped by it saves a checkpoint on SIGTERM, and every 500 steps), SFT_TIMEOUT
# (120 s), BUDGET (500 s from this script's start to the end of RL: gpu.sh's install comes before).
# The code run is this checkout's (laid out as the installed package in /tmp/task-rl-src), not the carried
# dlmspec wheel, so no wheel has to be rebuilt after a commit; the wheels give the dependencies.
set -uo pipefail
cd "$(dirname "$0")/../../.."
repo=$PWD
dry=0
for a in "$@"; do [ "$a" = --dry ] && dry=1; done
OUT=${OUT:-/tmp/bench-out}
TASK=${TASK:-addition-padded}
DIGITS=${DIGITS:-3}
TRAIN_ITERS=${TRAIN_ITERS:-2000}
TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-210}
EVAL_PROMPTS=${EVAL_PROMPTS:-500}
BUDGET=${BUDGET:-500}
SFT_ITERS=${SFT_ITERS:-1000}
SFT_TIMEOUT=${SFT_TIMEOUT:-120}
RL_FROM=${RL_FROM:-sft}
RL_ITERS=${RL_ITERS:-24}
TEST=${TEST:-1000}
t0=$(date +%s)
mkdir -p "$OUT"
log() { echo "[task-rl +$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/steps.log"; }

# this checkout as the installed package (package-dir of pyproject.toml), first on the path
src=${SRC:-/tmp/task-rl-src}
[ "$dry" = 1 ] && src=$OUT/dry-src
rm -rf "$src" && mkdir -p "$src"
cp -r dlmspec "$src/dlmspec" && cp -r backends "$src/dlmspec/backends" && cp -r templates "$src/dlmspec/templates" \
  && cp -r specs "$src/dlmspec/specs"
if [ "$dry" = 1 ]; then
  PY=${PY:-$repo/.venv/bin/python}
  [ -x "$PY" ] || PY=python3
  export PYTHONPATH=$src
else
  PY=${PY:-python3}
  export PYTHONPATH=$src:${PYTHONPATH:-}
fi
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1 DLMSPEC_PYTHON=$PY
dl() { "$PY" -m dlmspec.cli "$@"; }

work=${WORK:-/tmp/task-rl}
[ "$dry" = 1 ] && work=$OUT/dry-work
rm -rf "$work" && mkdir -p "$work/.data"
cp -r specs "$work/specs"
gpt2=.bench-data/gpt2
[ -f "$gpt2/vocab.json" ] || gpt2=${GPT2_DIR:-/work/main/.bench-data/gpt2}
cp -r "$gpt2" "$work/.data/gpt2" || { log "no GPT-2 BPE files (carry .bench-data: bench/devbox/fetch_fast_dllm.sh)"; exit 2; }
cd "$work"  # the specs' relative paths (.data/..., runs/...) are from here

log "task: $TASK --digits $DIGITS"
dl task make "$TASK" --out .data/task-addition --digits "$DIGITS" --test "$TEST" > "$OUT/task.log" 2>&1 || { cat "$OUT/task.log"; exit 2; }
for s in train validation; do
  dl data prepare --input ".data/task-addition/pretrain-$s.jsonl" --output-prefix ".data/task-addition-${s/validation/valid}" \
    --tokenizer-type GPT2BPETokenizer --vocab-file .data/gpt2/vocab.json --merge-file .data/gpt2/merges.txt \
    --append-eod --workers 8 >> "$OUT/task.log" 2>&1 || { tail -20 "$OUT/task.log"; exit 2; }
done
log "data prepared"
# the SFT stage's data (LLaDA's layout, the plain template) and the held-out prompts rendered with it; the SFT
# rows are tokenised in one process: in the background while the GPU trains
"$PY" - <<'EOF2'
import json
from dlmspec.data.chat import render, text_of
with open(".data/task-addition/test.jsonl") as f, open(".data/task-addition/test-plain.jsonl", "w") as g:
    for line in f:
        row = json.loads(line)
        row["prompt"] = text_of(render("plain", [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True))
        g.write(json.dumps(row, sort_keys=True) + "\n")
EOF2
( for s in train validation; do
    dl data prepare --sft --chat-template plain --input ".data/task-addition/sft-$s.jsonl" \
      --output-prefix ".data/task-addition-sft-${s/validation/valid}" --tokenizer-type GPT2BPETokenizer \
      --vocab-file .data/gpt2/vocab.json --merge-file .data/gpt2/merges.txt --seq-length 24 || exit 1
  done ) > "$OUT/sft-data.log" 2>&1 &
pid_sft_data=$!

common=(--set cluster.gpus_per_node=1 --set train.train_iters="$TRAIN_ITERS" --set checkpoint.save_interval=500)
for kind in dlm ar; do
  dl compile "specs/task-addition-$kind.toml" -o "job-$kind" --force --python "$PY" "${common[@]}" \
    > "$OUT/compile-$kind.log" 2>&1 || { cat "$OUT/compile-$kind.log"; exit 2; }
done
dl compile specs/task-addition-dlm-sft.toml -o job-sft --force --python "$PY" --set cluster.gpus_per_node=1 \
  --set train.train_iters="$SFT_ITERS" > "$OUT/compile-sft.log" 2>&1 || { cat "$OUT/compile-sft.log"; exit 2; }
# RL from the SFT model (its prompts rendered with the plain template, as it was tuned) or from the DLM
rl=(--set cluster.gpus_per_node=1 --set train.train_iters="$RL_ITERS" --set checkpoint.save_interval="$RL_ITERS"
    --set train.lr_warmup_iters=3)
if [ "$RL_FROM" = sft ]; then
  rl+=(--set 'checkpoint.init_from="mcore:runs/task-addition-dlm-sft/checkpoints"' --set 'stage.rl.chat_template="plain"')
  rl_test=.data/task-addition/test-plain.jsonl
else
  rl_test=.data/task-addition/test.jsonl
fi
dl compile specs/task-addition-dlm-rl.toml -o job-rl --force --python "$PY" "${rl[@]}" \
  > "$OUT/compile-rl.log" 2>&1 || { cat "$OUT/compile-rl.log"; exit 2; }
for kind in dlm ar sft rl; do cp "job-$kind/plan.json" "$OUT/plan-$kind.json"; done
log "compiled: job-dlm job-ar job-sft job-rl (rl from $RL_FROM)"
if [ "$dry" = 1 ]; then
  wait $pid_sft_data; log "sft data exit $?"
  dl validate specs/task-addition-dlm-sft.toml --set train.train_iters="$SFT_ITERS" > "$OUT/validate-sft.log" 2>&1
  log "validate sft exit $? (the init_from checkpoint is missing on a dry run: a warning)"
  log "dry: would run, on the GPU: bash job-dlm/launch.sh & bash job-ar/launch.sh (side by side), then"
  log "dry:   bash job-sft/launch.sh (from the DLM's checkpoint), dlmspec eval of each (--task test.jsonl;"
  log "dry:   the SFT model --task test-plain.jsonl), bash job-rl/launch.sh, dlmspec eval runs/task-addition-dlm-rl"
  exit 0
fi

# (a) both task models at once on the one GPU (a 153M model at micro batch 64 leaves it mostly idle)
timeout -s TERM -k 30 "$TRAIN_TIMEOUT" bash job-dlm/launch.sh > "$OUT/train-dlm.log" 2>&1 &
pid_dlm=$!
timeout -s TERM -k 30 "$TRAIN_TIMEOUT" bash job-ar/launch.sh > "$OUT/train-ar.log" 2>&1 &
pid_ar=$!
wait $pid_dlm; rc_dlm=$?
wait $pid_ar; rc_ar=$?
log "trained: dlm exit $rc_dlm, ar exit $rc_ar"
for kind in dlm ar; do
  cp "runs/task-addition-$kind/metrics.jsonl" "$OUT/metrics-$kind.jsonl" 2>/dev/null
  grep -h "generation accuracy" "$OUT/train-$kind.log" | tail -3
done
score() {  # score KIND RUN_DIR TEST_FILE: held-out exact match of a run's last checkpoint
  timeout 90 "$PY" -m dlmspec.cli eval "$2" --task "$3" --max-prompts "$EVAL_PROMPTS" --json \
    > "$OUT/eval-$1.json" 2> "$OUT/eval-$1.log"
  log "eval $1 exit $?: $(head -c 600 "$OUT/eval-$1.json")"
}
wait $pid_sft_data; log "sft data exit $?"
# the SFT stage from the DLM's checkpoint, while the two pre-trained models are scored beside it
timeout -s TERM -k 30 "$SFT_TIMEOUT" bash job-sft/launch.sh > "$OUT/train-sft.log" 2>&1 &
pid_sft=$!
score dlm runs/task-addition-dlm .data/task-addition/test.jsonl
score ar runs/task-addition-ar .data/task-addition/test.jsonl
wait $pid_sft; log "sft exit $?"
cp runs/task-addition-dlm-sft/metrics.jsonl "$OUT/metrics-sft.jsonl" 2>/dev/null
grep -h "generation accuracy" "$OUT/train-sft.log" | tail -3
score sft runs/task-addition-dlm-sft .data/task-addition/test-plain.jsonl

# (b) RL on the trained DLM (init_from = its checkpoints, as the spec says)
left=$(( BUDGET - ($(date +%s) - t0) ))  # gpu.sh's install ran before t0
log "rl: $RL_ITERS steps, ${left}s left"
timeout -s TERM -k 10 $(( left > 60 ? left - 40 : 20 )) bash job-rl/launch.sh > "$OUT/train-rl.log" 2>&1
log "rl exit $?"
cp runs/task-addition-dlm-rl/metrics.jsonl "$OUT/metrics-rl.jsonl" 2>/dev/null
cp runs/task-addition-dlm-rl/rollouts.jsonl "$OUT/rollouts-rl.jsonl" 2>/dev/null
score rl runs/task-addition-dlm-rl "$rl_test"

# (c) the summary
"$PY" - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]

def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError):
        return None

def accuracy(name):
    """The eval --task record (the dict holding "accuracy" and "interval_95", wherever the JSON nests it)."""
    todo = [load(name)]
    while todo:
        doc = todo.pop()
        if isinstance(doc, dict):
            if "accuracy" in doc and "interval_95" in doc:
                return {k: doc.get(k) for k in ("accuracy", "correct", "n", "interval_95", "file")}
            todo.extend(doc.values())
    return None

def rewards(name):
    rows = []
    try:
        for line in open(os.path.join(out, name)):
            e = json.loads(line)
            if e.get("event") == "train" and "rl/reward_mean" in e:
                rows.append([e.get("iteration"), e["rl/reward_mean"], e.get("rl/kl")])
    except OSError:  # the stage did not run (or wrote no metrics): the summary shows no rewards for it
        pass
    return rows

rl = rewards("metrics-rl.jsonl")
summary = {"dlm_heldout": accuracy("eval-dlm.json"), "ar_heldout": accuracy("eval-ar.json"),
           "dlm_sft_heldout": accuracy("eval-sft.json"),
           "rl_heldout_after": accuracy("eval-rl.json"),
           "rl_reward_per_logged_step": rl, "rl_reward_first": rl[0][1] if rl else None,
           "rl_reward_last": rl[-1][1] if rl else None}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
print(json.dumps(summary, indent=2))
EOF
log "done; results in $OUT"
