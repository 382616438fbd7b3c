#!/usr/bin/env bash
# Session 6 (issues #15, #16) on one H200: the compiled demo trains from a WHEEL install of dlmspec
# (train.py imports dlmspec.backends from site-packages; the checkout is not on PYTHONPATH), is
# stopped by SIGTERM at step 150, resumes to 300, and an uninterrupted run of the same spec runs
# beside it for comparison (bench/gpu/demo_resume.sh). Then a resume with another model shape must
# be refused before megatron-core starts (exit 2).
# Prepare (CPU machine):
#   .venv/bin/python -m pip wheel --no-deps --no-build-isolation -w .whl/dl .
#   .venv/bin/python bench/gpu/prepare.py --demo          (-> .device/demo, .device/demo-ref)
#   .venv/bin/dlmspec compile specs/demo-dlm.toml -o .device/demo-shape --set model.num_layers=6 \
#     --set 'logging.run_dir="runs/demo-shape"' --set 'logging.tensorboard_dir="runs/demo-shape/tensorboard"'
#   (same checkpoint.save as the demo: it must refuse to resume the demo's checkpoint)
# Device (repository root; carry .whl/mc .whl/dl .data .device):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mc/*.whl .whl/dl/*.whl \
#     && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 && bash bench/gpu/session6_wheel.sh $OUT
# Summarise (CPU machine): python3 bench/gpu/summarize_resume.py OUT/work bench/results/wheel_demo_resume_h200.json
set -u
out=${1:?usage: session6_wheel.sh OUT_DIR}
mkdir -p "$out/work"
python3 - > "$out/work/where.txt" 2>&1 <<'PY'
import dlmspec, dlmspec.backends.megatron.training as t, megatron.core, torch
print("dlmspec", dlmspec.__file__)
print("runtime", t.__file__)
print("megatron-core", megatron.core.__version__, "torch", torch.__version__)
PY
cat "$out/work/where.txt"
STOP_AT=150 bash bench/gpu/demo_resume.sh "$out/work"
# The stopped-and-resumed run's checkpoint folder, read by a spec with another model shape.
timeout 120 bash .device/demo-shape/launch.sh > "$out/work/shape.log" 2>&1
echo "shape exit $?" >> "$out/work/shape.log"
tail -5 "$out/work/shape.log"
tar czf "$out/logs.tgz" -C "$out/work" .
