#!/usr/bin/env bash
# Development GPU machine only: ONE command per suite, from the repository root, within one call of at most
# 10 minutes (the machine is held at most 30 minutes; nothing outside it is reachable). It installs the wheels
# carried in .bench-wheels/ (bench/devbox/install.sh; dlmspec from its wheel, so no checkout on sys.path),
# then runs the suite's launcher with a budget that fits the call, results under $OUT (bench/schema.py):
#
#   bash bench/devbox/gpu.sh throughput   # Qwen3-1.7B-architecture DLM, seq 4096: dlmspec local bf16 vs HF plain, HF+Liger (~5 min)
#   bash bench/devbox/gpu.sh sampling     # the demo trained 100 steps, then dlmspec generate vs the LLaDA-style HF loop, batch 1 and 8 (~3 min)
#   bash bench/devbox/gpu.sh fast-sampling  # task model pre-trained then SFT-tuned (~4 min), then dlmspec's block caches and parallel decoding
#                                           # vs the peers' HF loop and Fast-dLLM's own code, batch 1/8/32, held-out accuracy;
#                                           # with a minute left, host_overhead.py --profile at batch 32 (host-graphs-b32-profile.json)
#                                           # (carry .bench-wheels .bench-peers .bench-data: bench/devbox/fetch_fast_dllm.sh)
#   bash bench/devbox/gpu.sh scaling      # the bundled scaling studies: 28 small runs side by side, each evaluated (~5-8 min)
#                                           # (carry .bench-wheels .data: python bench/scaling/run.py --prepare-data)
#   bash bench/devbox/gpu.sh rl-diffu-grpo    # the addition task's DLM trained, SFT, held-out accuracy, diffu-GRPO,
#                                             # held-out accuracy after, reward/KL plot, planned vs measured step
#                                             # time, rollout tokens/s beside d1's loop (~9 min; carry .bench-wheels
#                                             # .bench-data .bench-peers: bench/devbox/fetch_fast_dllm.sh)
#   bash bench/devbox/gpu.sh rl-coupled-grpo  # the same with coupled-GRPO
#   bash bench/devbox/gpu.sh rl-grpo          # the same for the AR model with GRPO (no SFT, no d1 loop)
#                                             # (each rl-*: with a minute left, host_overhead.py --cuda-graph at
#                                             # batch 1, the commit step's graph on and off: host-graphs-commit-b1.json)
#   ALGO=... bash bench/devbox/gpu.sh task-rl # the same as rl-ALGO (bench/devbox/gpu/task_rl.sh)
#   bash bench/devbox/gpu.sh rl-step-time     # the three RL algorithms' step time on one host, planned against
#                                             # measured (short runs from a briefly trained task model, no accuracy;
#                                             # ~6 min; carry .bench-wheels .bench-data)
#   bash bench/devbox/gpu.sh calibration --part 1/2   # the planner's local-path calibration, first half of the
#                                                     # one-GPU matrix (~9 min; --part 2/2 the rest; mock data)
#   bash bench/devbox/gpu.sh SUITE --dry  # the same launcher line with --dry (CPU)
#
# Everything specific to that machine is here: the carried wheels, /tmp paths, the time limits.
set -uo pipefail
cd "$(dirname "$0")/../.."
suite=${1:?usage: gpu.sh throughput|sampling|fast-sampling|scaling|calibration|rl-step-time|rl-diffu-grpo|rl-coupled-grpo|rl-grpo|task-rl [--dry]}
t_start=$(date +%s)
shift
OUT=${OUT:-/tmp/bench-out}
SITE=${SITE:-/tmp/bench-site}
PY=${PY:-python3}
mkdir -p "$OUT"
dry=0
for a in "$@"; do [ "$a" = --dry ] && dry=1; done
if [ "$dry" = 0 ]; then
  SITE=$SITE PY=$PY bash bench/devbox/install.sh > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 2; }
  tail -1 "$OUT/install.log"
  echo "gpu.sh: install took $(( $(date +%s) - t_start ))s"
  export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH
fi
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1  # never the checkout's dlmspec/ from the working directory

# host_tail NAME BATCH ARGS...: with at least 60 s of the call left (585 s from this script's start), the
# sampler's per-step time on the demo shape (random weights, CUDA graphs, the four paths of the fast-sampling
# suite) at BATCH, into $OUT/NAME.json and NAME.log; nothing on --dry
host_tail() {
  local name=$1 batch=$2 left
  shift 2
  left=$(( 585 - ($(date +%s) - t_start) ))
  [ "$dry" = 0 ] && [ "$left" -ge 60 ] || return 0
  timeout -s TERM -k 5 $(( left - 10 )) "$PY" bench/sampling/host_overhead.py --device cuda --bf16 --layers 12 \
    --hidden 768 --heads 12 --vocab 50304 --batch "$batch" --cuda-graph \
    --paths low_confidence,threshold,low_confidence_prefix,low_confidence_dual \
    --out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1 || echo "gpu.sh: $name did not finish (see $name.log)"
}

case "$suite" in
  throughput)
    # 3 jobs of one micro batch each (~90 s apiece: start-up, 3 warm-up + 5 timed steps); the harness stops
    # starting jobs when less than 60 s of its budget is left and writes what it measured on SIGTERM.
    timeout -s TERM -k 10 560 "$PY" bench/throughput/run.py --out "$OUT" --work-dir /tmp/bench-work/throughput \
      --model qwen3-1.7b --gpus 1 --precision bf16 --peers plain,liger \
      --megatron-micro-batch-sizes 4 --hf-micro-batch-sizes 4 --warmup 3 --steps 5 \
      --timeout-s 170 --budget-s 520 "$@" ;;
  sampling)
    timeout -s TERM -k 10 560 "$PY" bench/sampling/run.py --out "$OUT" --work-dir /tmp/bench-work/sampling \
      --gpus 1 --train-iters 100 --batches 1,8 --gen-length 128 --steps 128 --block-length 32 \
      --timeout-s 400 "$@" ;;
  fast-sampling)
    # The whole call is at most 600 s: what the install took is taken off the launcher's budget; the
    # launcher stops starting work when its budget runs out and writes what it measured.
    budget=$(( 560 - ($(date +%s) - t_start) ))
    timeout -s TERM -k 10 $(( budget + 15 )) "$PY" bench/sampling/fast_sampling.py --out "$OUT" \
      --work-dir /tmp/bench-work/fast-sampling --gpus 1 --budget-s "$budget" "$@"
    rc=$?
    # what is left of the call: where a step's time goes at batch 32 (host_overhead.py --profile)
    host_tail host-graphs-b32-profile 32 --repeats 3 --profile
    (exit $rc) ;;
  scaling)
    # The bundled scaling studies (28 small runs, 8 side by side on the GPU, then dlmspec eval of each): carry
    # .bench-wheels and .data (python bench/scaling/run.py --prepare-data on the CPU machine). The launcher stops
    # starting runs when its budget (what is left of 560 s after the install) runs out and writes what it measured.
    budget=$(( 560 - ($(date +%s) - t_start) ))
    timeout -s TERM -k 10 $(( budget + 20 )) "$PY" bench/scaling/run.py --out "$OUT" --work-dir /tmp/bench-work/scaling \
      --gpus 1 --python "$PY" --budget-s "$budget" "$@" ;;
  rl-diffu-grpo|rl-coupled-grpo|rl-grpo|task-rl)
    # one RL algorithm per call: its task model trained in the call, held-out accuracy before and after RL
    # (bench/devbox/gpu/task_rl.sh; everything written within 570 s of this script's start, the install included)
    algo=${ALGO:-diffu-grpo}
    [ "$suite" != task-rl ] && algo=${suite#rl-}
    ALGO=$algo GPU_SH_START=$t_start bash bench/devbox/gpu/task_rl.sh "$@"
    rc=$?
    # what is left of the call: the forward's CUDA graphs with and without the commit step's own graph
    # (host_overhead.py --cuda-graph: commit_graph_speedup), at batch 1, where the host's work a step shows
    host_tail host-graphs-commit-b1 1 --repeats 5
    (exit $rc) ;;
  rl-step-time)
    # the RL step time of all three algorithms on this host, planned against measured (no accuracy:
    # bench/devbox/gpu/rl_step_time.sh; everything written within 570 s of this script's start)
    GPU_SH_START=$t_start bash bench/devbox/gpu/rl_step_time.sh "$@" ;;
  calibration)
    # The planner's local-path calibration: the one-GPU entries of bench/plan/matrix.json on the local layers
    # (mock data: carry .bench-wheels only), one run at a time, within what is left of 560 s after the install.
    # ~19 runs of 45-70 s: two calls, `calibration --part 1/2` and `calibration --part 2/2`; each launch's
    # console comes back in calibration-logs.tgz.
    budget=$(( 560 - ($(date +%s) - t_start) ))
    timeout -s TERM -k 10 $(( budget + 20 )) "$PY" bench/calibration/run.py --path local+sdpa --out "$OUT" \
      --work-dir /tmp/bench-work/calibration --python "$PY" --budget-s "$budget" --repeats 0 "$@"
    rc=$?
    [ "$dry" = 0 ] && tar czf "$OUT/calibration-logs.tgz" -C /tmp/bench-work/calibration out 2>/dev/null
    (exit $rc) ;;
  *) echo "gpu.sh: unknown suite $suite (throughput, sampling, fast-sampling, scaling, calibration, rl-step-time, rl-diffu-grpo, rl-coupled-grpo, rl-grpo, task-rl)" >&2; exit 2 ;;
esac
rc=$?
echo "gpu.sh: $suite exit $rc; results in $OUT"
exit $rc
