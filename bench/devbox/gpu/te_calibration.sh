#!/usr/bin/env bash
# the planner's Transformer Engine calibration - the 9 configurations of
# bench/plan/te_matrix.json (Qwen3-1.7B-architecture DLM at sequence 4096: bf16, fp8 delayed and
# tensorwise, micro batches 4..16, selective and full recomputation, an 8-expert grouped-GEMM MoE;
# 3 held out, their plans committed before the run in bench/plan/te_holdout_predictions.json), one
# run at a time on one H200, within BUDGET_S (default 420 s) in all, each launch killed at its own
# limit. Details: bench/gpu/te_calibration.py.
#
# CPU (from the repository root; compiles into .device/tecal and checks every train.py's flags):
#   bash bench/devbox/gpu/te_calibration.sh --dry
# GPU, one H200, after TE is installed into /tmp/site_te (../shared/gpu/transformer-engine.md) and
# dlmspec + megatron-core into PYTHONPATH by the lead's wrapper (the script puts /tmp/site_te first when
# it is missing from PYTHONPATH; it compiles the entries there, ~10 s, and needs no .data: mock data):
#   bash bench/devbox/gpu/te_calibration.sh $OUT          (BUDGET_S=420 by default; ~7.5 min in all)
# $OUT then holds bench/calibration/te/h200/te-matrix-2026-12-02.json (bench/plan/calibrate.py's format: copy it to
# bench/results/) and te_calibration_logs.tgz (each launch's console).
set -u
cd "$(dirname "$0")/../../.." || exit 2
. bench/devbox/gpu/driver.sh
driver_dry te_calibration "$@"
out=${1:?usage: te_calibration.sh OUT | te_calibration.sh --dry}
shift
# Transformer Engine first on the path where the recipe installed it (../shared/gpu/transformer-engine.md)
if [ -d /tmp/site_te ]; then
  case ":${PYTHONPATH:-}:" in *:/tmp/site_te:*) ;; *) export PYTHONPATH=/tmp/site_te${PYTHONPATH:+:$PYTHONPATH} ;; esac
fi
export PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpus.txt" 2>&1
"$PY" bench/gpu/te_calibration.py "$out" --budget-s "${BUDGET_S:-420}" "$@"
rc=$?
# the result, gpus.txt and one archive of the logs
driver_archive "$out" te_calibration_logs.tgz "" '*.log'
exit $rc
