#!/bin/bash
# Stop the test cluster that tests/slurm/start-cluster.sh started.
#
#   bash tests/slurm/stop-cluster.sh [STATE_DIR] [--keep-munge]
#
# Cancels its jobs, stops slurmd and slurmctld (by the pids in STATE_DIR), and munged when
# start-cluster.sh started it (unless --keep-munge). Bounded: a daemon still alive after 10 s
# gets SIGKILL. Exits 0 when nothing is left running.
set -uo pipefail

dir=${DLMSPEC_SLURM_DIR:-/tmp/dlmspec-slurm}
keep_munge=0
for arg in "$@"; do
  case "$arg" in
    --keep-munge) keep_munge=1 ;;
    *) dir=$arg ;;
  esac
done

# Stop process PID if it is NAME (a stale pid file never kills an unrelated process).
stop_pid() {
  local pid=$1 name=$2
  [[ $pid =~ ^[0-9]+$ && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$name" ]] || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "stop-cluster.sh: $name ($pid) still running after 10 s; SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null
  return 0
}

ctld_pid=$(cat "$dir/slurmctld.pid" 2>/dev/null || true)
if [[ -f "$dir/slurm.conf" && -n $ctld_pid && "$(cat "/proc/$ctld_pid/comm" 2>/dev/null)" == slurmctld ]]; then
  SLURM_CONF="$dir/slurm.conf" timeout 10 scancel --full --signal=KILL --state=RUNNING >/dev/null 2>&1
  SLURM_CONF="$dir/slurm.conf" timeout 10 scancel --full >/dev/null 2>&1
fi
for daemon in slurmd slurmctld; do
  if [[ -f "$dir/$daemon.pid" ]]; then
    stop_pid "$(cat "$dir/$daemon.pid")" "$daemon"
    rm -f "$dir/$daemon.pid"
  fi
done
if [[ $keep_munge -eq 0 && -f "$dir/munged.started-here" ]]; then
  if [[ -f /run/munge/munged.pid ]]; then
    stop_pid "$(cat /run/munge/munged.pid)" munged
  fi
  rm -f "$dir/munged.started-here"
fi
exit 0
