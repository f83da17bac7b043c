# A private Slurm cluster for the tests, from Debian's slurm-wlm and munge: its own munge
# key and socket, slurmctld and slurmd on free ports, all state under one directory, one
# node named localhost (a name that resolves everywhere, as a cluster's node names do)
# with 4 CPUs and 8 stand-in GPUs, so the example scripts' --gpus-per-node is honoured.
# Nothing outside the directory is read or written but the daemons' ports.
# Usage: source private_slurm.sh; start_private_slurm DIR (exports SLURM_CONF);
#        stop_private_slurm. private_slurm_missing prints why it cannot run, if it cannot.

private_slurm_missing() {
  [[ $(id -u) -eq 0 ]] || { echo "a private Slurm runs its daemons as root"; return; }
  local b
  for b in munged mungekey slurmctld slurmd sbatch srun scontrol squeue; do
    command -v "$b" > /dev/null || [[ -x /usr/sbin/$b ]] || { echo "$b is not installed (slurm-wlm, munge)"; return; }
  done
}

free_port() {
  "${TIDE_PYTHON:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_private_slurm() {  # start_private_slurm DIR
  slurm_dir=$1
  mkdir -p "$slurm_dir"/{munge,state,spool,log}
  chmod 700 "$slurm_dir" "$slurm_dir/munge"
  PATH=$PATH:/usr/sbin
  mungekey -c -k "$slurm_dir/munge/munge.key"
  munged -f --key-file="$slurm_dir/munge/munge.key" --socket="$slurm_dir/munge/munge.sock" \
    --pid-file="$slurm_dir/munge/munged.pid" --log-file="$slurm_dir/munge/munged.log" \
    --seed-file="$slurm_dir/munge/munged.seed"
  local ctld_port d_port
  ctld_port=$(free_port)
  d_port=$(free_port)
  cat > "$slurm_dir/slurm.conf" <<EOF
ClusterName=tidetest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$slurm_dir/munge/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$slurm_dir/state
SlurmdSpoolDir=$slurm_dir/spool
SlurmctldPidFile=$slurm_dir/slurmctld.pid
SlurmdPidFile=$slurm_dir/slurmd.pid
SlurmctldLogFile=$slurm_dir/log/slurmctld.log
SlurmdLogFile=$slurm_dir/log/slurmd.log
PlugStackConfig=$slurm_dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 Gres=gpu:8 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  # Slurm keeps only GPUs with device files; empty files stand in (no cgroup reads them).
  mkdir -p "$slurm_dir/dev"
  touch "$slurm_dir"/dev/gpu{0..7}
  echo "NodeName=localhost Name=gpu File=$slurm_dir/dev/gpu[0-7]" > "$slurm_dir/gres.conf"
  : > "$slurm_dir/plugstack.conf"
  export SLURM_CONF=$slurm_dir/slurm.conf
  slurmctld -f "$SLURM_CONF" -i
  slurmd -f "$SLURM_CONF" -N localhost
  local state=
  for _ in $(seq 300); do
    state=$(sinfo -h -n localhost -o %T 2> /dev/null || true)
    [[ $state == idle ]] && return 0
    sleep 0.1
  done
  cat "$slurm_dir"/log/*.log >&2
  echo "FAIL: the private Slurm's node is '$state' after 30 s, not idle" >&2
  return 1
}

stop_private_slurm() {
  [[ -n ${slurm_dir:-} ]] || return 0
  scancel --full --signal=KILL --user=root 2> /dev/null || true
  local f
  for f in "$slurm_dir/slurmd.pid" "$slurm_dir/slurmctld.pid" "$slurm_dir/munge/munged.pid"; do
    [[ -f $f ]] && kill -9 "$(cat "$f")" 2> /dev/null || true
  done
}
