# cluster.sh - a one-node Slurm cluster on loopback for the tests (sourced,
# not run): munged with its own key and socket, slurmctld and slurmd with a
# generated slurm.conf, all state, spool and logs under one directory, on
# ports of their own, so it neither needs nor disturbs a system Slurm.
#
#   slurm_cluster_start DIR   writes DIR/slurm.conf, starts the three daemons,
#                             exports SLURM_CONF, waits until the node is idle;
#                             returns non-zero (with the reason on stdout and
#                             the daemons' logs under DIR/log) if it cannot
#   slurm_cluster_stop        stops what slurm_cluster_start started (also
#                             safe when it failed half way)
#   slurm_cluster_skip_reason prints why this machine cannot run the cluster
#                             (not root, daemons missing), nothing if it can
#   slurm_job_field JOB KEY   one KEY=value field of `scontrol show job JOB`
#   slurm_wait_state JOB STATES SECS
#                             waits until the job's state is one of the
#                             |-separated STATES; prints the state
#
# Facts of Slurm 22.05 (Debian 12) this relies on: auth/munge reaches munged
# through AuthInfo=socket=PATH; proctrack/linuxproc and task/none need no
# cgroups (containers often lack them); a node named in slurm.conf is the one
# `slurmd -N NAME` serves, whatever the host is called.

SLURM_NODE=orchnode
slurm_cluster_dir=""

slurm_cluster_skip_reason() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "not root (slurmd and munged of the test cluster run as root)"; return
  fi
  local b
  for b in munged slurmctld slurmd sbatch srun scontrol scancel sinfo; do
    if ! command -v "$b" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$b" ]; then
      echo "$b not found (tools/setup.sh installs slurm-wlm and munge)"; return
    fi
  done
}

# A free TCP port on 127.0.0.1 near $1 (a simple probe: nothing listens).
slurm_free_port() {
  local p=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
  echo "$p"
}

slurm_cluster_start() {
  local d=$1 i cpus mem port
  slurm_cluster_dir=$d
  mkdir -p "$d/state" "$d/spool" "$d/log" "$d/munge"
  chmod 755 "$d" "$d/munge"
  head -c 1024 /dev/urandom >"$d/munge/munge.key"
  chmod 400 "$d/munge/munge.key"
  PATH=$PATH:/usr/sbin
  if ! munged --force -S "$d/munge/sock" --key-file="$d/munge/munge.key" \
      --log-file="$d/log/munged.log" --pid-file="$d/munge/munged.pid" \
      --seed-file="$d/munge/seed" >"$d/log/munged.out" 2>&1; then
    echo "munged did not start: $(tail -n 1 "$d/log/munged.out")"; return 1
  fi
  cpus=$(nproc)
  mem=$(awk '/MemTotal/ { printf "%d", $2 / 1024 / 2 }' /proc/meminfo)
  port=$(slurm_free_port $((17800 + $$ % 1000)))
  local port2
  port2=$(slurm_free_port $((port + 1)))
  cat >"$d/slurm.conf" <<EOF
ClusterName=orchtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$port2
AuthType=auth/munge
AuthInfo=socket=$d/munge/sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=5
MinJobAge=600
NodeName=$SLURM_NODE NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=orchtest Nodes=$SLURM_NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  export SLURM_CONF=$d/slurm.conf
  if ! slurmctld -f "$SLURM_CONF" >"$d/log/slurmctld.out" 2>&1; then
    echo "slurmctld did not start: $(tail -n 1 "$d/log/slurmctld.out")"; return 1
  fi
  if ! slurmd -f "$SLURM_CONF" -N "$SLURM_NODE" >"$d/log/slurmd.out" 2>&1; then
    echo "slurmd did not start: $(tail -n 1 "$d/log/slurmd.out")"; return 1
  fi
  for ((i = 0; i < 300; i++)); do
    if sinfo -h -n "$SLURM_NODE" -o %t 2>/dev/null | grep -qx idle; then return 0; fi
    sleep 0.1
  done
  echo "node $SLURM_NODE did not become idle in 30 s: $(sinfo -h -o '%t %E' 2>&1 | head -n 1)"
  return 1
}

slurm_cluster_stop() {
  local d=$slurm_cluster_dir f
  [ -n "$d" ] || return 0
  [ -n "${SLURM_CONF:-}" ] && scancel --quiet --user=root 2>/dev/null
  for f in slurmd.pid slurmctld.pid munge/munged.pid; do
    [ -s "$d/$f" ] && kill "$(cat "$d/$f")" 2>/dev/null
  done
  sleep 0.5
  for f in slurmd.pid slurmctld.pid munge/munged.pid; do
    [ -s "$d/$f" ] && kill -9 "$(cat "$d/$f")" 2>/dev/null
  done
  slurm_cluster_dir=""
}

slurm_job_field() {
  scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

slurm_wait_state() {
  local job=$1 want=$2 secs=$3 i st
  for ((i = 0; i < secs * 5; i++)); do
    st=$(slurm_job_field "$job" JobState)
    if [ -n "$st" ] && grep -qxE "$want" <<<"$st"; then echo "$st"; return 0; fi
    sleep 0.2
  done
  echo "${st:-unknown}"
  return 1
}
