#!/bin/bash
# Start a one-node SLURM cluster on loopback for tests/integration/render/test_slurm_cluster.py (and CI).
#
#   bash tests/slurm/start-cluster.sh [STATE_DIR]     (default: $DLMSPEC_SLURM_DIR or /tmp/dlmspec-slurm)
#   export SLURM_CONF=STATE_DIR/slurm.conf             then sbatch, squeue, sinfo ... talk to it
#   bash tests/slurm/stop-cluster.sh [STATE_DIR]
#
# Needs root and Debian's slurm-wlm and munge (apt-get install -y slurm-wlm munge). Everything the
# cluster writes stays in STATE_DIR; /etc/slurm is not touched. The node is this host
# (NodeName=$(hostname -s), NodeAddr=127.0.0.1) with 2 CPUs and 8 fake GPUs (GRES backed by empty
# devices in STATE_DIR/dev), in partition "debug" (the default). Partition "multinode" adds 63 nodes
# (128 CPUs, 8 GPUs each) that exist only in the configuration (State=CLOUD: powered down, never
# started) so that `sbatch --test-only --partition=multinode` can judge multi-node scripts.
# No cgroups: proctrack/linuxproc, task/none, jobacct_gather/none. Controller and node daemon run
# as root; munged as munge.
# Idempotent: a cluster already answering with this configuration is left running. Every wait is
# bounded; exit status 1 with the daemons' logs on failure.
set -euo pipefail

dir=${1:-${DLMSPEC_SLURM_DIR:-/tmp/dlmspec-slurm}}
ctld_port=${DLMSPEC_SLURMCTLD_PORT:-6817}
slurmd_port=${DLMSPEC_SLURMD_PORT:-6818}
wait_seconds=${DLMSPEC_SLURM_WAIT:-60}

fail() {
  echo "start-cluster.sh: $*" >&2
  for log in "$dir"/slurmctld.log "$dir"/slurmd.log /var/log/munge/munged.log; do
    if [[ -f "$log" ]]; then
      echo "--- last lines of $log" >&2
      tail -n 20 "$log" >&2
    fi
  done
  exit 1
}

[[ $(id -u) -eq 0 ]] || fail "must run as root (slurmd runs jobs as their user)"
for tool in munged slurmctld slurmd sinfo scontrol; do
  command -v "$tool" >/dev/null || fail "$tool not found: apt-get install -y slurm-wlm munge"
done

host=$(hostname -s)
# Jobs rendezvous at the node's name (MASTER_ADDR from scontrol show hostnames).
getent hosts "$host" >/dev/null || fail "this host's name $host does not resolve: add it to /etc/hosts"
mkdir -p "$dir/state" "$dir/spool"
export SLURM_CONF="$dir/slurm.conf"

# munge: one daemon per host, shared by everything that uses it.
if ! munge -n </dev/null >/dev/null 2>&1; then
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge /etc/munge
  if [[ ! -s /etc/munge/munge.key ]]; then
    runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
  fi
  runuser -u munge -- munged || fail "munged did not start"
  touch "$dir/munged.started-here"
  for _ in $(seq 1 50); do
    munge -n </dev/null >/dev/null 2>&1 && break
    sleep 0.1
  done
  munge -n </dev/null >/dev/null 2>&1 || fail "munged does not answer"
fi

memory_mb=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) * 8 / 10240 ))
cat >"$dir/slurm.conf.new" <<EOF
# Written by tests/slurm/start-cluster.sh: a one-node test cluster on loopback.
ClusterName=dlmspec-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=10
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
MailProg=/bin/true
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 RealMemory=$memory_mb Gres=gpu:8 State=UNKNOWN
NodeName=dlmspec-future[1-63] CPUs=128 RealMemory=$memory_mb Gres=gpu:8 State=CLOUD
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=multinode Nodes=$host,dlmspec-future[1-63] Default=NO MaxTime=INFINITE State=UP
EOF
# SLURM drops GPUs without device files: character devices that are /dev/null (1,3) stand in for
# /dev/nvidia0-7 (empty files where mknod is not allowed; slurmd then only logs an error).
mkdir -p "$dir/dev"
for index in 0 1 2 3 4 5 6 7; do
  device="$dir/dev/nvidia$index"
  if [[ ! -c "$device" ]]; then
    rm -f "$device"
    mknod "$device" c 1 3 2>/dev/null || touch "$device"
  fi
done
cat >"$dir/gres.conf" <<EOF
AutoDetect=off
NodeName=$host Name=gpu File=$dir/dev/nvidia[0-7]
NodeName=dlmspec-future[1-63] Name=gpu File=$dir/dev/nvidia[0-7]
EOF

# A daemon runs when its pid file names a live process of that name (not a reused pid).
running() {
  local pid
  pid=$(cat "$dir/$1.pid" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$1" ]]
}

if running slurmctld && running slurmd && cmp -s "$dir/slurm.conf.new" "$dir/slurm.conf"; then
  rm -f "$dir/slurm.conf.new"
else
  bash "$(dirname -- "$0")/stop-cluster.sh" "$dir" --keep-munge >/dev/null 2>&1 || true
  mv "$dir/slurm.conf.new" "$dir/slurm.conf"
  rm -rf "${dir:?}/state/"* "${dir:?}/spool/"*
  slurmctld -c -f "$SLURM_CONF" || fail "slurmctld did not start"
  slurmd -f "$SLURM_CONF" || fail "slurmd did not start"
fi

deadline=$(( SECONDS + wait_seconds ))
state=""
while (( SECONDS < deadline )); do
  state=$(sinfo -h -N -n "$host" -p debug -o '%T' 2>/dev/null || true)
  if [[ $state == idle ]]; then
    echo "SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  if [[ $state == drain* || $state == down* ]]; then
    scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true
  fi
  sleep 0.5
done
fail "node $host is not idle after ${wait_seconds}s (state: ${state:-none})"
