#!/usr/bin/env bash
# Development GPU machine only: gather on a machine WITH a package index and the tool library what the
# fast-sampling suite (bench/sampling/fast_sampling.py) needs on a GPU machine WITHOUT network, into
# ignored folders carried with the working tree:
#
#   .bench-peers/fast-dllm/   Fast-dLLM's LLaDA files (llada/generate.py, llada/model/*, LICENSE), pinned by
#                             commit (COMMIT), read out of a git copy of github:NVlabs/Fast-dLLM; never committed
#   .bench-peers/wheels/      the transformers its requirements.txt pins (4.49.0) and the tokenizers and
#                             huggingface-hub versions that transformers accepts (it checks them at import)
#   .bench-data/gpt2/         GPT-2's BPE (vocab.json, merges.txt) of the offline data kit: the task's tokenizer
#
#   FAST_DLLM_GIT=/path/to/Fast-dLLM/.git bash bench/devbox/fetch_fast_dllm.sh     # from the repository root
#
# FAST_DLLM_GIT: a git directory holding the pinned commit (default: the tool library's mirror,
# /work/.mirror/NVlabs+Fast-dLLM/repo; `git clone https://github.com/NVlabs/Fast-dLLM` elsewhere).
# SHARED_DATA: the data kit (default ../shared/data beside the checkout, else /work/shared/data).
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMIT=${FAST_DLLM_COMMIT:-24cc59e75f20a6384bae8c905965bb090b96388e}   # 2025-06-27, llada/ with prefix + dual cache
GIT=${FAST_DLLM_GIT:-/work/.mirror/NVlabs+Fast-dLLM/repo}
PY=${PY:-.venv/bin/python}
DEST=.bench-peers
for d in "$DEST" .bench-data; do
  git check-ignore -q "$d/x" || { echo "fetch_fast_dllm: $d is not ignored by git (add /$d/ to .gitignore): refusing to write there" >&2; exit 2; }
done
if ! git --git-dir="$GIT" cat-file -e "$COMMIT^{commit}" 2>/dev/null; then
  echo "fetch_fast_dllm: $GIT has no commit $COMMIT; set FAST_DLLM_GIT to a clone of github:NVlabs/Fast-dLLM" >&2
  exit 2
fi
rm -rf "$DEST/fast-dllm"
mkdir -p "$DEST/fast-dllm/llada/model" "$DEST/wheels" .bench-data/gpt2
for f in LICENSE llada/generate.py llada/model/__init__.py llada/model/configuration_llada.py llada/model/modeling_llada.py; do
  git --git-dir="$GIT" show "$COMMIT:$f" > "$DEST/fast-dllm/$f"
done
echo "$COMMIT" > "$DEST/fast-dllm/COMMIT"
(cd "$DEST/fast-dllm" && sha256sum LICENSE llada/generate.py llada/model/*.py > SHA256SUMS)
for pkg in "transformers==4.49.0" "tokenizers>=0.21,<0.22" "huggingface-hub>=0.26,<1.0"; do
  "$PY" -m pip download -q --no-deps --python-version 3.12 --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --implementation cp --abi cp312 --abi abi3 --abi none -d "$DEST/wheels" "$pkg"
done
SHARED=${SHARED_DATA:-../shared/data}
[ -f "$SHARED/tokenizers/gpt2/vocab.json" ] || SHARED=/work/shared/data
cp "$SHARED/tokenizers/gpt2/vocab.json" "$SHARED/tokenizers/gpt2/merges.txt" .bench-data/gpt2/
du -sh "$DEST" .bench-data
ls "$DEST/wheels"
