#!/usr/bin/env bash
# GPU checks of the megatron runtime on one GPU (run from the repository root).
#
#   bash bench/runtime/gpu_session.sh OUT_DIR [STEPS...]
#
# STEPS (default: all but resume): smoke demo signal qwen-mb4 qwen-mb8 qwen-mb8-sel resume
# Each step runs bench/runtime/train_reference.py under a time limit and keeps
# going if one fails.  Every run's metrics.jsonl is appended, tagged with the
# step name, to OUT_DIR/metrics_all.jsonl; console output goes to
# OUT_DIR/session.log (few files, so they fit the device tool's return limits).
set -u
OUT_DIR=${1:?usage: gpu_session.sh OUT_DIR [STEPS...]}
shift
STEPS=${*:-smoke demo signal qwen-mb4 qwen-mb8 qwen-mb8-sel}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/session.log"
METRICS="$OUT_DIR/metrics_all.jsonl"
WORK=${WORK:-/tmp/dlmspec-gpu}
rm -rf "$WORK"; mkdir -p "$WORK"
REF="python3 -u bench/runtime/train_reference.py"
export PYTHONUNBUFFERED=1

collect() {  # collect TAG RUN_DIR
    if [ -f "$2/metrics.jsonl" ]; then
        python3 -c 'import json,sys
tag=sys.argv[1]
for line in open(sys.argv[2]):
    r=json.loads(line); r["run"]=tag; r.pop("run_config", None); print(json.dumps(r))' "$1" "$2/metrics.jsonl" >> "$METRICS"
    fi
}

run() {  # run TAG LIMIT_S ARGS...
    local tag=$1 limit=$2; shift 2
    echo "=== $tag: $REF $* (limit ${limit}s)" | tee -a "$LOG"
    local t0=$(date +%s)
    timeout --preserve-status -s KILL "$limit" $REF "$@" --run-dir "$WORK/$tag" >> "$LOG" 2>&1
    local rc=$?
    echo "=== $tag: exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
    collect "$tag" "$WORK/$tag"
    return $rc
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'; } >> "$LOG" 2>&1

for step in $STEPS; do
case $step in
smoke)
    # Also tells whether megatron's torch.compile'd fusions work here; the
    # Qwen3 runs fall back to --no-fusion if they do not.
    run smoke 240 --preset tiny --train-iters 20 --log-interval 5 --micro-batch-size 4 --global-batch-size 8 \
        || QFLAGS="--no-fusion" ;;
demo)
    # A: uninterrupted 60 steps.  B: same run stopped (and saved) at 30.
    # C: relaunch of B, resumes at 30 and runs to 60; its losses must equal A's.
    DEMO="--preset demo --train-iters 40 --log-interval 2 --micro-batch-size 8 --global-batch-size 16 --eval-interval 20 --no-fusion"
    run demo-A 240 $DEMO --save-dir "$WORK/ckpt-A"
    run demo-B 240 $DEMO --save-dir "$WORK/ckpt-BC" --stop-at-iteration 20
    run demo-C 240 $DEMO --save-dir "$WORK/ckpt-BC"
    ls -la "$WORK/ckpt-BC" "$WORK/ckpt-BC"/iter_0000020 >> "$LOG" 2>&1
    cat "$WORK/ckpt-BC/latest" >> "$LOG" 2>&1 ;;
resume)
    # demo-B and demo-C only (compare C with an earlier demo-A).
    DEMO="--preset demo --train-iters 40 --log-interval 2 --micro-batch-size 8 --global-batch-size 16 --eval-interval 20 --no-fusion"
    run demo-B 240 $DEMO --save-dir "$WORK/ckpt-BC" --stop-at-iteration 20
    run demo-C 240 $DEMO --save-dir "$WORK/ckpt-BC" ;;
signal)
    # SIGTERM during training: save, exit 85, then a relaunch resumes.
    SIG="--preset demo --train-iters 400 --log-interval 5 --micro-batch-size 8 --global-batch-size 16 --no-fusion"
    echo "=== signal: $REF $SIG" | tee -a "$LOG"
    $REF $SIG --save-dir "$WORK/ckpt-S" --run-dir "$WORK/signal" >> "$LOG" 2>&1 &
    pid=$!
    for _ in $(seq 1 180); do
        grep -q '"iteration": 20,' "$WORK/signal/metrics.jsonl" 2>/dev/null && break
        sleep 1
    done
    kill -TERM $pid
    wait $pid
    echo "=== signal: exit $? (expected 85)" | tee -a "$LOG"
    cat "$WORK/ckpt-S/latest" "$WORK/signal/exit_status.json" >> "$LOG" 2>&1
    collect signal "$WORK/signal"
    run signal-resume 240 $SIG --save-dir "$WORK/ckpt-S" --stop-at-iteration 40 ;;
qwen-mb4)
    run qwen-mb4 300 --preset qwen3-1.7b --micro-batch-size 4 --train-iters 20 --log-interval 5 ${QFLAGS:-} ;;
qwen-mb8)
    # Without expandable segments micro batch 8 ran 5 steps at 127 GiB peak and
    # then failed to find an 18.5 GiB block (fragmentation).  Fall back to 6.
    (
        export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        echo "PYTORCH_CUDA_ALLOC_CONF=$PYTORCH_CUDA_ALLOC_CONF" >> "$LOG"
        run qwen-mb8 300 --preset qwen3-1.7b --micro-batch-size 8 --train-iters 15 --log-interval 5 ${QFLAGS:-} \
        || run qwen-mb6 300 --preset qwen3-1.7b --micro-batch-size 6 --train-iters 15 --log-interval 5 ${QFLAGS:-}
    ) ;;
qwen-mb8-sel)
    run qwen-mb8-sel 300 --preset qwen3-1.7b --micro-batch-size 8 --train-iters 15 --log-interval 5 --recompute selective ${QFLAGS:-} ;;
*)
    echo "unknown step $step" | tee -a "$LOG" ;;
esac
done
echo "=== done" | tee -a "$LOG"
