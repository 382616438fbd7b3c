#!/usr/bin/env bash
# The demo's first 50 steps (of a 60-step run: warm-up is 50 steps, so its learning rates are the demo's) before and after a refactor, one after the other on one GPU, then
# bench/throughput/loss_agreement.py with a same-commit rerun as the noise floor.
#
# On the CPU machine first (repository root):
#   git archive BASE | tar -x -C /tmp/presrc && pip wheel --no-deps --no-build-isolation -w .pre /tmp/presrc
#   python -c "import sys; sys.path.insert(0, 'bench/gpu'); import prepare; prepare.demo_inputs()"   # .data/
# On the GPU machine (carry .whl/mc .pre .data), from the repository root:
#   bash bench/demos/refactor_agreement.sh        # $OUT/agreement.json and $OUT/refactor_agreement.tgz (logs, metrics)
set -u
top=${OUT:?set OUT}
out=$top/refactor_agreement
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1 DLMSPEC_PYTHON=python3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mc/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/pre .pre/dlmspec-*.whl || exit 1
python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/postw . > "$out/wheel.log" 2>&1 || { tail "$out/wheel.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/post /tmp/postw/dlmspec-*.whl || exit 1
for side in pre post post-again; do
  site=/tmp/${side%-again}
  export PYTHONPATH=$site:/tmp/site
  rm -rf "runs/agree-$side" "/tmp/c-$side"
  python3 -m dlmspec.cli compile specs/demo-dlm.toml -o "/tmp/c-$side" --set "name=\"agree-$side\"" \
    --set train.train_iters=60 --set logging.log_interval=1 --set checkpoint.save_interval=1000 \
    > "$out/compile-$side.log" 2>&1 || { tail "$out/compile-$side.log"; exit 1; }
  t0=$(date +%s)
  timeout 170 bash "/tmp/c-$side/launch.sh" > "$out/train-$side.log" 2>&1
  echo "$side: exit $? after $(( $(date +%s) - t0 )) s ($(python3 -c 'import dlmspec; print(dlmspec.__file__)'))"
  cp "runs/agree-$side/metrics.jsonl" "$out/metrics-$side.jsonl"
  rm -rf "runs/agree-$side/checkpoints"
done
PYTHONPATH=/tmp/post:/tmp/site python3 bench/throughput/loss_agreement.py "$out/metrics-pre.jsonl" "$out/metrics-post.jsonl" \
  --steps 50 --noise "$out/metrics-post-again.jsonl" --json "$out/agreement.json"
rc=$?
echo "loss_agreement exit $rc"
cp "$out/agreement.json" "$top/" 2>/dev/null
tar czf "$top/refactor_agreement.tgz" -C "$top" refactor_agreement && rm -rf "$out"
