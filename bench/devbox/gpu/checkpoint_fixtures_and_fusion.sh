#!/usr/bin/env bash
# One GPU machine (torch 2.11, Python 3.12, no registry): real checkpoint fixtures of torch 2.11 with
# megatron-core 0.16.1 and 0.19.2 (for the checkpoint allow-list's tests), then Transformer Engine and
# the gradient-accumulation-fusion measurement. Every result is written under $OUT before a call ends.
#
# On the CPU machine first (repository root):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl/mc megatron-core==0.16.1 \
#       pydantic==2.13.4 pydantic-core==2.46.4 annotated-types typing-inspection tomli-w
#   pip download ... -d .whl/mc19 megatron-core==0.19.2
#   bash ../shared/gpu/te-parts.sh; mkdir -p .device && cp ../shared/gpu/te-install.sh .device/
# Device calls, back to back (carry in brackets):
#   STEP=start  [.whl/mc .whl/mc19 .whl/te/core.part.05]  megatron-core 0.16.1 (+ dlmspec) into /tmp/site and
#               0.19.2 into /tmp/site19; the fixtures of both pairs and the allow-list tests on them
#   STEP=part N [.whl/te/core.part.0N]  (N = 0..4)
#   STEP=te     [.whl/te/small .whl/te/core.md5 .device/te-install.sh]  TE into /tmp/site_te
#   STEP=site   [.whl/mc .whl/te/core.part.05]  megatron-core 0.16.1 + dlmspec into /tmp/site only (no fixtures)
#   STEP=tegaf  [as te]  te, then gaf with a 400 s budget, in one call
#   STEP=gaf    []  bench/throughput/grad_accum_fusion.py (fusion on against off, TE layers, one GPU)
set -u
out=${OUT:?set OUT}
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
case "${STEP:?}" in
  start)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; python3 --version
    python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/dlw . > "$out/wheel.log" 2>&1 || { tail "$out/wheel.log"; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mc/*.whl /tmp/dlw/*.whl || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site19 .whl/mc19/*.whl || exit 1
    mkdir -p /tmp/te && cp .whl/te/core.part.05 /tmp/te/
    mkdir -p "$out/fixtures"
    for site in /tmp/site /tmp/site19:/tmp/site; do
      PYTHONPATH=$site python3 bench/checkpoint/write_metadata_fixtures.py "$out/fixtures" > "$out/fixtures.log" 2>&1 \
        || { echo "fixture writer failed ($site)"; tail -n 20 "$out/fixtures.log"; }
    done
    ls "$out/fixtures"
    cp -r "$out"/fixtures/* tests/fixtures/checkpoints/
    for site in /tmp/site /tmp/site19:/tmp/site; do
      echo "allow-list tests with PYTHONPATH=$site:"
      PYTHONPATH=$site:tests python3 -m pytest -p no:cacheprovider tests/integration/checkpoint/test_checkpoint_safety.py -q \
        -k "each_real_checkpoint or payload" 2>&1 | tail -n 4
    done
    (cd "$out" && tar czf fixtures.tgz fixtures && rm -rf fixtures) ;;
  site)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 --version
    python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/dlw . > "$out/wheel.log" 2>&1 || { tail "$out/wheel.log"; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mc/*.whl /tmp/dlw/*.whl || exit 1
    mkdir -p /tmp/te && cp .whl/te/core.part.05 /tmp/te/ && ls /tmp/te ;;
  part)
    mkdir -p /tmp/te && cp ".whl/te/core.part.0${N:?part number}" /tmp/te/ && ls /tmp/te ;;
  te)
    bash .device/te-install.sh .whl/te/small > "$out/te_install.log" 2>&1
    echo "te-install exit $?"; tail -n 2 "$out/te_install.log"
    cp /tmp/te/out/transformer_engine_torch-*.whl "$out/" 2>/dev/null ;;
  gaf)
    export PYTHONPATH=/tmp/site_te:/tmp/site
    timeout 560 python3 bench/throughput/grad_accum_fusion.py --out "$out" --budget-s 500 > "$out/grad_accum_fusion.log" 2>&1
    echo "grad_accum_fusion exit $?"; tail -n 25 "$out/grad_accum_fusion.log" ;;
  tegaf)
    bash .device/te-install.sh .whl/te/small > "$out/te_install.log" 2>&1
    echo "te-install exit $?"; tail -n 2 "$out/te_install.log"
    cp /tmp/te/out/transformer_engine_torch-*.whl "$out/" 2>/dev/null
    export PYTHONPATH=/tmp/site_te:/tmp/site
    timeout 470 python3 bench/throughput/grad_accum_fusion.py --out "$out" --budget-s 400 > "$out/grad_accum_fusion.log" 2>&1
    echo "grad_accum_fusion exit $?"; tail -n 25 "$out/grad_accum_fusion.log" ;;
esac
