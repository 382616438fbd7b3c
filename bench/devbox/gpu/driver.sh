# Sourced (from the repository root) by the scripts of a bench/gpu driver, te_matrix.sh and
# te_calibration.sh: what both do around their Python driver.

# driver_dry NAME ARGS...: when ARGS start with --dry, run bench/gpu/NAME.py --dry REST (CPU: the
# checkout's .venv/bin/python when there is one, else $PY or python3) in place of the calling script;
# otherwise return, with PY set ($PY or python3), for the GPU run.
driver_dry() {
  local name=$1
  shift
  PY=${PY:-python3}
  if [ "${1:-}" = "--dry" ]; then
    shift
    [ -x .venv/bin/python ] && PY=.venv/bin/python
    exec "$PY" "bench/gpu/$name.py" --dry "$@"
  fi
}

# driver_archive OUT ARCHIVE KEEP PATTERN...: few files come back from a device call, so the files of
# OUT that match the PATTERNs (globs, in OUT), but for the one named KEEP, go into OUT/ARCHIVE (tar.gz)
# and are removed; nothing happens when there are none.
driver_archive() {
  local out=$1 archive=$2 keep=$3
  shift 3
  # the PATTERNs expand inside OUT, unquoted on purpose
  # shellcheck disable=SC2048,SC2086
  (cd "$out" && files=$(ls $* 2>/dev/null | grep -vxF "$keep") && [ -n "$files" ] && tar czf "$archive" $files && rm -f $files)
}
