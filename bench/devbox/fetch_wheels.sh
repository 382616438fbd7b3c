#!/usr/bin/env bash
# Development GPU machine only: gather on a machine WITH a package index the wheels the suites need on a
# GPU machine WITHOUT one (Python 3.12, x86_64, torch already installed), into .bench-wheels/ (ignored
# by git; carried to the GPU machine with the working tree, at most 64 MiB).
#
#   bash bench/devbox/fetch_wheels.sh            # from the repository root
#
# .bench-wheels/dlmspec-*.whl      dlmspec itself, built from this checkout (a non-editable install)
# .bench-wheels/*.whl              its runtime dependencies and the throughput peers (pure Python or cp312
#                                  manylinux), fetched with pip download --no-deps; bench/devbox/install.sh
#                                  installs on the GPU machine only those its Python cannot import already.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DEST=${DEST:-.bench-wheels}
MC=${MC:-/work/main/.whl/mc}   # megatron-core 0.16.1 and pydantic, if already at hand
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" .
if [ -d "$MC" ]; then cp "$MC"/*.whl "$DEST"/; fi
pkgs=(
  "megatron-core==0.16.1" "pydantic>=2.6,<3" pydantic-core annotated-types typing-inspection tomli-w   # dlmspec + runtime
  typer click rich shellingham markdown-it-py mdurl pygments jinja2 markupsafe typing-extensions    # dlmspec's CLI
  psutil einops "tokenizers>=0.19" "safetensors>=0.4"                                              # runtime extra
  "transformers>=4.45" "huggingface-hub" regex pyyaml filelock fsspec packaging tqdm requests      # HF peers
  "liger-kernel==0.8.5"                                                                             # HF+Liger peer
)
for pkg in "${pkgs[@]}"; do
  name=${pkg%%[<>=]*}
  if ls "$DEST" | grep -qi "^$(echo "$name" | tr - _)-"; then continue; fi
  "$PY" -m pip download -q --no-deps --python-version 3.12 --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --implementation cp --abi cp312 --abi abi3 --abi none -d "$DEST" "$pkg" \
    || echo "fetch_wheels: could not fetch $pkg (install.sh uses the GPU machine's copy, if any)" >&2
done
du -sh "$DEST"
total=$(du -sb "$DEST" | cut -f1)
if [ "$total" -gt $((64 * 1024 * 1024)) ]; then
  echo "fetch_wheels: $DEST holds $total bytes, more than the 64 MiB one call carries: drop wheels the GPU image has" >&2
  exit 1
fi
ls "$DEST"
