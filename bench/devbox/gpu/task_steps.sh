# shellcheck shell=bash
# Sourced by the addition task's GPU scripts (task_rl.sh, rl_step_time.sh) from the repository root: what they share.
# task_text calls the sourcing script's `step NAME LIMIT CMD...` and `limit WANT`, and runs in its work folder.

# rl_job ALGO: sets rl_spec, rl_name (its run folder's name) and model (dlm or ar) of ALGO's bundled RL spec;
# returns 1 for anything but diffu-grpo, coupled-grpo and grpo
# shellcheck disable=SC2034  # the sourcing script reads them
rl_job() {
  case "$1" in
    diffu-grpo) rl_spec="specs/task-addition-dlm-rl.toml" rl_name="task-addition-dlm-rl" model="dlm" ;;
    coupled-grpo) rl_spec="specs/task-addition-dlm-rl-coupled.toml" rl_name="task-addition-dlm-rl-coupled" model="dlm" ;;
    grpo) rl_spec="specs/task-addition-ar-rl.toml" rl_name="task-addition-ar-rl" model="ar" ;;
    *) return 1 ;;
  esac
}

# gpu_id: the planner's id of the GPU nvidia-smi names (h200, h100-pcie, h100; h100 without a GPU: a --dry
# run plans for an H100)
gpu_id() {
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) echo h200 ;; *H100*PCIe*) echo h100-pcie ;; *) echo h100 ;;
  esac
}

# task_text TASK DIGITS TEST ROWS WORKERS: the task's files under .data/task-addition (`dlmspec task make`) and
# its pre-training text tokenised (.data/task-addition-train / -valid, WORKERS processes each)
task_text() {
  local task=$1 digits=$2 test=$3 rows=$4 workers=$5 s
  step task "$(limit 60)" "$PY" -m dlmspec.cli task make "$task" --out .data/task-addition --digits "$digits" \
    --test "$test" --train "$rows" || return 2
  for s in train validation; do
    step "data-$s" "$(limit 60)" "$PY" -m dlmspec.cli data prepare --input ".data/task-addition/pretrain-$s.jsonl" \
      --output-prefix ".data/task-addition-${s/validation/valid}" --tokenizer-type GPT2BPETokenizer \
      --vocab-file .data/gpt2/vocab.json --merge-file .data/gpt2/merges.txt --append-eod --workers "$workers" || return 2
  done
}
