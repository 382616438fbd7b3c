#!/usr/bin/env bash
# Third GPU session (nvidia-h200-x2), from the repository root, after
# `.venv/bin/python bench/gpu/prepare.py --demo` and the fused-CE calibration directories:
#   part a (two lanes in parallel, one GPU each):
#     GPU 0: issue #7 throughput: SDPA backends, the runtime at micro batch 8 with megatron's
#            cross entropy / the fused linear cross entropy / + cuDNN attention, the best at
#            micro batches 10 and 12, then the Hugging Face baseline at 4 and 6;
#     GPU 1: issue #3 stop/resume of the compiled demo (bench/gpu/demo_resume.sh), then
#            one-GPU calibration directories given in ONE_GPU_DIRS.
#   part b (both GPUs): two-GPU calibration (TP2+SP) and DP2 scaling of the best runtime variant.
# Everything lands in OUT_DIR/work; a tarball of it is OUT_DIR/session.tgz (the device tool
# returns at most 8 files).
#   part c: the PyTorch fused-CE implementation, init_from at TP 1 and 2, DP2 with bf16 reduction.
# Usage: bash bench/gpu/session_x2_throughput.sh a|b|c OUT_DIR
set -u
part=${1:?usage: a|b OUT_DIR}; out=${2:?usage: a|b OUT_DIR}
work="$out/work"; mkdir -p "$work"
tp() { python3 bench/throughput/run.py --out "$work" --timeout-s 150 --budget-s 400 "$@"; }
best_args() {  # the fastest micro-batch-8 variant's extra arguments, from the tp jobs' JSON
  python3 - "$work" <<'PY'
import glob, json, sys
best = (0.0, "")
for path in glob.glob(f"{sys.argv[1]}/throughput_*_v-*.json"):
    d = json.load(open(path))
    tag = path.rsplit("_v-", 1)[1][:-5]
    b = (d.get("megatron") or {}).get("best") or {}
    if (b.get("tokens_per_s") or 0) > best[0]:
        best = (b["tokens_per_s"], tag)
args = {"base": "", "fused": "--megatron-arg=--cross-entropy=fused_linear",
        "fusedcudnn": "--megatron-arg=--cross-entropy=fused_linear --megatron-arg=--sdpa-backend=cudnn"}
print(args.get(best[1], "--megatron-arg=--cross-entropy=fused_linear --megatron-arg=--sdpa-backend=cudnn"))
PY
}
if [ "$part" = a ]; then
  (
    export CUDA_VISIBLE_DEVICES=0
    timeout 60 python3 bench/throughput/sdpa_backends.py --json "$work/sdpa_backends.json" > "$work/sdpa_backends.log" 2>&1
    tp --sides megatron --megatron-micro-batch-sizes 8 --tag v-base
    tp --sides megatron --megatron-micro-batch-sizes 8 --tag v-fused --megatron-arg=--cross-entropy=fused_linear
    tp --sides megatron --megatron-micro-batch-sizes 8 --tag v-fusedcudnn --megatron-arg=--cross-entropy=fused_linear \
       --megatron-arg=--sdpa-backend=cudnn
    best=$(best_args); echo "best variant: $best" > "$work/best_variant.txt"
    # shellcheck disable=SC2086
    tp --sides megatron --megatron-micro-batch-sizes 10,12 --tag best-large $best
    tp --sides hf --hf-micro-batch-sizes 4,6 --tag hf
  ) > "$work/lane0.log" 2>&1 &
  lane0=$!
  (
    export CUDA_VISIBLE_DEVICES=1
    STOP_AT=150 bash bench/gpu/demo_resume.sh "$work"
    if [ -n "${ONE_GPU_DIRS:-}" ]; then
      # shellcheck disable=SC2086
      bash bench/gpu/run_matrix.sh "$work/calibration_1gpu_fusedce.json" 100 $ONE_GPU_DIRS
    fi
    if [ -f bench/convert/init_from_gpu.sh ]; then timeout 150 bash bench/convert/init_from_gpu.sh "$work" > "$work/init_from.log" 2>&1; fi
  ) > "$work/lane1.log" 2>&1 &
  lane1=$!
  wait "$lane0" "$lane1"
elif [ "$part" = c ]; then
  # GPU 0: the fused linear CE's PyTorch implementation (vs Liger's) at micro batch 10;
  # GPU 1: checkpoint.init_from at TP 1 (bench/convert/init_from_gpu.py); then DP2 with bf16
  # gradient reduction and the parameter all-gather overlapped; then init_from at TP 2.
  CUDA_VISIBLE_DEVICES=0 tp --sides megatron --megatron-micro-batch-sizes 10 --tag v-fusedtorch-mb10 \
    --megatron-arg=--cross-entropy=fused_linear --megatron-arg=--fused-linear-impl=torch \
    --work-dir /tmp/tp-gpu0 > "$work/lane0_c.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 OUT="$work" timeout 200 python3 bench/convert/init_from_gpu.py run --tp 1 > "$work/init_from_tp1.log" 2>&1
  wait
  mv "$work/init_from_gpu.json" "$work/init_from_gpu_tp1.json" 2>/dev/null
  tar czf "$out/session_c.tgz" -C "$out" work  # what is done so far, should a later step run out of time
  tp --sides megatron --nproc 2 --megatron-micro-batch-sizes 8 --tag dp2-bf16-overlap \
    --megatron-arg=--cross-entropy=fused_linear --megatron-arg=--grad-reduce-in-bf16 --megatron-arg=--overlap-param-gather
  tar czf "$out/session_c.tgz" -C "$out" work
  OUT="$work" timeout 200 python3 bench/convert/init_from_gpu.py run --tp 2 > "$work/init_from_tp2.log" 2>&1
  mv "$work/init_from_gpu.json" "$work/init_from_gpu_tp2.json" 2>/dev/null
else
  # cuDNN attention with dense operands (part a's cuDNN variant fell back: strided views),
  # micro batch 8 on GPU 0 and 10 on GPU 1 at once.
  cudnn=(--megatron-arg=--cross-entropy=fused_linear --megatron-arg=--sdpa-backend=cudnn)
  CUDA_VISIBLE_DEVICES=0 tp --sides megatron --megatron-micro-batch-sizes 8 --tag v-fusedcudnn2 "${cudnn[@]}" \
    --work-dir /tmp/tp-gpu0 > "$work/lane0_b.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 tp --sides megatron --megatron-micro-batch-sizes 10 --tag v-fusedcudnn2-mb10 "${cudnn[@]}" \
    --work-dir /tmp/tp-gpu1 > "$work/lane1_b.log" 2>&1
  wait
  bash bench/gpu/run_matrix.sh "$work/calibration_2gpu_b.json" 100 .device/plan/demo-tp2-sp .device/plan/qwen3-1.7b-tp2-sp
  best=(--megatron-arg=--cross-entropy=fused_linear)
  if grep -q "best megatron: micro batch 8, 3[6-9],\|best megatron: micro batch 8, [4-9][0-9]," "$work/lane0_b.log"; then best=("${cudnn[@]}"); fi
  tp --sides megatron --nproc 2 --megatron-micro-batch-sizes "${DP2_MBS:-8}" --tag dp2 "${best[@]}"
fi
tar czf "$out/session_$part.tgz" -C "$out" work
