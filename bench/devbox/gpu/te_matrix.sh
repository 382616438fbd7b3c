#!/usr/bin/env bash
# correctness first: the compiled demo (specs/demo-dlm.toml, 40 steps per configuration) on
# the Transformer Engine path - bf16 (TE's fused layer-norm + linear), fp8 delayed / tensorwise /
# blockwise, recompute selective and full, variable_length_prob 0.5 (TE's padding mask), save at 20 and
# resume to 40 - each against the local-path bf16 loss of the same seed; then MegaDLMs' objective per
# micro-batch, a small MoE (grouped GEMM on TE), init_from a Hugging Face model of the demo's shape
# (made on the spot) on both paths, and local bf16 on megatron-core 0.19.2 (from .whl/mc19, installed
# into /tmp/site19; "not run: no wheel" without it). Details: bench/gpu/te_matrix.py.
#
# CPU (from the repository root; makes .data from ../shared/data, compiles into .device/te, checks flags):
#   bash bench/devbox/gpu/te_matrix.sh --dry
#   (for the mc19 row and megatron-core 0.19.2's field names: python3 -m pip download megatron-core==0.19.2
#    --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl/mc19)
# GPU, one H200, after TE is installed into /tmp/site_te (../shared/gpu/transformer-engine.md) and
# dlmspec + megatron-core into PYTHONPATH by the lead's wrapper; carry .data and .device/te (and .whl/mc19):
#   export PYTHONPATH=/tmp/site_te:$PYTHONPATH PYTHONUNBUFFERED=1; bash bench/devbox/gpu/te_matrix.sh $OUT
# Every launch is killed at BUDGET_S (default 450 s) so the results come back within the call. $OUT then
# holds te_matrix.json (summary) and te_matrix_runs.tgz (NAME.json per configuration, NAME*.log).
# 18 rows, 19 launches (te-resume twice) on 4 lanes (+1 for the resume) after ~30 s of compiling and
# making the two Hugging Face models (0.3 + 0.4 GB, removed at the end): estimated, not measured,
# 40-60 s per launch (start-up ~30 s; the demo's step is ~0.09 s alone, bench/results/
# demo_compiled_h200.json; init_from rows also convert on the CPU), ~300-400 s in all. Launches
# not started by BUDGET_S are recorded as skipped_at_deadline. The rows added in one earlier GPU run alone, with
# the references they need (9 launches, ~150-200 s; one line):
#   NEW=local-bf16,local-bf16-again,mc19-local-bf16,local-varlen-microbatch,te-varlen-microbatch
#   NEW=$NEW,local-moe,te-moe,local-init-from-hf,te-init-from-hf; bash bench/devbox/gpu/te_matrix.sh $OUT --only $NEW
set -u
cd "$(dirname "$0")/../../.." || exit 2
. bench/devbox/gpu/driver.sh
driver_dry te_matrix "$@"
out=${1:?usage: te_matrix.sh OUT | te_matrix.sh --dry}
shift
"$PY" bench/gpu/te_matrix.py "$out" --budget-s "${BUDGET_S:-450}" --lanes "${LANES:-4}" "$@"
rc=$?
# te_matrix.json (the summary) and one archive of the per-configuration JSON files and logs
driver_archive "$out" te_matrix_runs.tgz te_matrix.json '*.json' '*.log'
exit $rc
