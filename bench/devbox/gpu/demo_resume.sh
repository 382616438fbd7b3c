#!/usr/bin/env bash
# the resume check with the compiled demo, on one GPU, from the repository root, after
# `bench/gpu/prepare.py --demo`:
#   1. launch .device/demo/launch.sh; once metrics.jsonl logs iteration STOP_AT, send SIGTERM to
#      the launcher (torchrun, as a scheduler's stop would): the runtime must save and exit;
#   2. launch it again: it must resume from that checkpoint and train to the end;
#   3. launch .device/demo-ref/launch.sh (same spec, own directories) uninterrupted.
# Then bench/gpu/summarize_resume.py compares the resumed losses with the uninterrupted ones.
# Usage: STOP_AT=150 bash bench/devbox/gpu/demo_resume.sh OUT_DIR
set -u
out=${1:?usage: demo_resume.sh OUT_DIR}
STOP_AT=${STOP_AT:-150}
mkdir -p "$out"
rm -rf runs/demo-dlm runs/demo-ref
t0=$(date +%s)
bash .device/demo/launch.sh > "$out/resume_launch1.log" 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  if grep -q "\"iteration\": $STOP_AT, " runs/demo-dlm/metrics.jsonl 2>/dev/null; then
    kill -TERM "$pid"; echo "SIGTERM sent after iteration $STOP_AT was logged ($(( $(date +%s) - t0 ))s)" >> "$out/resume_launch1.log"; break
  fi
  sleep 0.5
done
wait "$pid"; echo "launch1 exit $? after $(( $(date +%s) - t0 ))s" >> "$out/resume_launch1.log"
cp runs/demo-dlm/metrics.jsonl "$out/resume_metrics_launch1.jsonl" 2>/dev/null
t0=$(date +%s)
timeout -s KILL 240 bash .device/demo/launch.sh > "$out/resume_launch2.log" 2>&1
echo "launch2 exit $? after $(( $(date +%s) - t0 ))s" >> "$out/resume_launch2.log"
cp runs/demo-dlm/metrics.jsonl "$out/resume_metrics.jsonl" 2>/dev/null
ls runs/demo-dlm/checkpoints >> "$out/resume_launch2.log" 2>&1
t0=$(date +%s)
timeout -s KILL 240 bash .device/demo-ref/launch.sh > "$out/ref_launch.log" 2>&1
echo "ref exit $? after $(( $(date +%s) - t0 ))s" >> "$out/ref_launch.log"
cp runs/demo-ref/metrics.jsonl "$out/ref_metrics.jsonl" 2>/dev/null
