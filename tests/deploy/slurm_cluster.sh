#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A one-machine slurm cluster from Debian's packages (slurm-wlm, munge), for the tests: munged,
# slurmctld and slurmd with a private configuration under DIR, one node with this machine's CPUs.
#   slurm_cluster.sh start DIR     # prints "export SLURM_CONF=DIR/slurm.conf" when the node is up
#   slurm_cluster.sh stop DIR
# Root only (as CI and the tests run). Nothing outside DIR is changed but munge's run directory.
set -euo pipefail
# A start that fails says which command failed (the daemons' own messages follow it on stderr).
trap 'echo "slurm_cluster: \"$BASH_COMMAND\" failed with status $?" >&2' ERR
cmd=$1 dir=$2
host=$(hostname -s)
case "$cmd" in
start)
  mkdir -p "$dir"/{state,spool,munge}
  chmod 700 "$dir/munge"
  # A private munge key and socket, so that a system munged (if any) is left alone.
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chown munge:munge "$dir/munge" "$dir/munge/munge.key" 2>/dev/null || true
  chmod 400 "$dir/munge/munge.key"
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
  sock="$dir/munge/munge.socket"
  runuser -u munge -- munged --key-file="$dir/munge/munge.key" --socket="$sock" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed" \
    2>/dev/null || munged --force --key-file="$dir/munge/munge.key" --socket="$sock" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed"
  cpus=$(nproc)
  mem=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
  cat > "$dir/slurm.conf" <<CONF
ClusterName=lockstep-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
KillWait=30
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -c -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF"
  for _ in $(seq 1 150); do
    state=$(sinfo -h -N -o %t 2>/dev/null | head -1)
    [ "$state" = idle ] && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }
    sleep 0.2
  done
  echo "slurm_cluster: the node did not come up (state '$state')" >&2
  tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  exit 1
  ;;
stop)
  for p in slurmd slurmctld munge/munged; do
    [ -f "$dir/$p.pid" ] && kill "$(cat "$dir/$p.pid")" 2>/dev/null || true
  done
  sleep 0.5
  ;;
esac
