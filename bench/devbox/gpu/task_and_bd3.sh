#!/usr/bin/env bash
# One GPU call: the block-diffusion demo (bench/demos/bd3lm.py, shorter trainings) and the addition
# task's AR baseline (specs/task-addition-ar.toml on 3-digit addition, generation accuracy logged
# at every eval_interval). Carry: .whl/mc .data (GPT-2 BPE in .data/gpt2). Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 DLMSPEC_PYTHON=python3
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mc/*.whl
python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/w .
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/dl /tmp/w/dlmspec-*.whl
export PYTHONPATH=/tmp/dl:/tmp/site
t0=$(date +%s)
python3 bench/demos/bd3lm.py --work-dir /tmp/bd3 --out "$OUT" --python python3 --gpu h100 --train-iters 200 \
  > "$OUT/bd3lm.log" 2>&1
echo "bd3lm exit $? after $(( $(date +%s) - t0 ))s"
python3 -m dlmspec.cli task make addition --out .data/task-addition --digits 3 --force > "$OUT/task.log" 2>&1
for s in train validation; do
  python3 -m dlmspec.cli data prepare --input .data/task-addition/pretrain-$s.jsonl \
    --output-prefix .data/task-addition-${s/validation/valid} --tokenizer-type GPT2BPETokenizer \
    --vocab-file .data/gpt2/vocab.json --merge-file .data/gpt2/merges.txt --append-eod --workers 8 --force >> "$OUT/task.log" 2>&1
done
python3 -m dlmspec.cli compile specs/task-addition-ar.toml -o /tmp/task-ar --force --set cluster.gpus_per_node=1 \
  --set train.train_iters=1000 >> "$OUT/task.log" 2>&1
timeout 240 bash /tmp/task-ar/launch.sh > "$OUT/task-ar.log" 2>&1
echo "task-ar exit $? after $(( $(date +%s) - t0 ))s"
grep -h "generation accuracy" "$OUT/task-ar.log"
cp runs/task-addition-ar/metrics.jsonl "$OUT/task-ar-metrics.jsonl" 2>/dev/null
tail -5 "$OUT/bd3lm.log"
