#!/usr/bin/env bash
# Development GPU machine only (no package index, wheels carried in .bench-wheels/ by
# bench/devbox/fetch_wheels.sh): install dlmspec from its wheel (a non-editable install) and every
# carried dependency this Python cannot import already, into SITE (default /tmp/bench-site).
# Then: export PYTHONPATH=$SITE PATH=$SITE/bin:$PATH   (bench/devbox/gpu.sh does both).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
WHEELS=${WHEELS:-.bench-wheels}
SITE=${SITE:-/tmp/bench-site}
mkdir -p "$SITE"
# wheel file prefix -> the module that shows it is installed
declare -A module=(
  [megatron_core]=megatron.core [pydantic]=pydantic [pydantic_core]=pydantic_core [annotated_types]=annotated_types
  [typing_inspection]=typing_inspection [tomli_w]=tomli_w [typer]=typer [click]=click [rich]=rich
  [shellingham]=shellingham [markdown_it_py]=markdown_it [mdurl]=mdurl [pygments]=pygments [jinja2]=jinja2
  [markupsafe]=markupsafe [typing_extensions]=typing_extensions [psutil]=psutil [einops]=einops
  [tokenizers]=tokenizers [safetensors]=safetensors [transformers]=transformers [huggingface_hub]=huggingface_hub
  [regex]=regex [pyyaml]=yaml [filelock]=filelock [fsspec]=fsspec [packaging]=packaging [tqdm]=tqdm
  [requests]=requests [liger_kernel]=liger_kernel
)
picked=()
for whl in "$WHEELS"/*.whl; do
  base=$(basename "$whl"); prefix=$(echo "${base%%-*}" | tr 'A-Z' 'a-z')
  if [ "$prefix" = dlmspec ]; then picked+=("$whl"); continue; fi
  mod=${module[$prefix]:-}
  if [ -z "$mod" ]; then echo "install.sh: $base: no module known, skipped" >&2; continue; fi
  if PYTHONSAFEPATH=1 PYTHONPATH=$SITE "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)" 2>/dev/null; then
    echo "install.sh: $mod already importable, $base not installed"
  else
    picked+=("$whl")
  fi
done
echo "install.sh: installing ${#picked[@]} wheels into $SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${picked[@]}"
PYTHONSAFEPATH=1 PYTHONPATH=$SITE "$PY" -c "import dlmspec, dlmspec.templates, dlmspec.backends, megatron.core, torch; \
print('install.sh: dlmspec', dlmspec.__version__, 'from', dlmspec.__file__, '; torch', torch.__version__)"
