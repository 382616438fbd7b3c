# shellcheck shell=bash
# Sourced by the GPU scripts (from the repository root): package_src SRC DRY lays this checkout out as
# the installed package (pyproject.toml's package-dir: dlmspec/ with backends/, templates/ and specs/
# inside) in SRC, puts SRC first on PYTHONPATH, and sets PY: the checkout's .venv Python for a dry run
# (python3 when there is none), else python3; a PY already set is kept.
package_src() {
  local src=$1 dry=$2
  rm -rf "$src" && mkdir -p "$src" || return 1
  cp -r dlmspec "$src/dlmspec" && cp -r backends "$src/dlmspec/backends" && cp -r templates "$src/dlmspec/templates" \
    && cp -r specs "$src/dlmspec/specs" || return 1
  if [ "$dry" = 1 ]; then
    PY=${PY:-$PWD/.venv/bin/python}
    [ -x "$PY" ] || PY=python3
    export PYTHONPATH=$src
  else
    PY=${PY:-python3}
    export PYTHONPATH=$src:${PYTHONPATH:-}
  fi
}
