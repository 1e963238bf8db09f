#!/usr/bin/env bash
# Shared-file writes across Slurm ranks, checked byte for byte.
#
# Starts a single-node Slurm cluster on loopback (Debian's slurm-wlm and
# munge; root needed), runs
#   srun -n RANKS -O pagewriter io --shared-file FILE --size SIZE --rw write ...
# with a SIZE that does not divide by RANKS, then checks every byte of FILE
# against the generator (`pagewriter gen` of the same size, cmp) and prints
# the aggregate of the per-rank reports (`pagewriter report`).
#
# It writes /etc/slurm/slurm.conf (restored afterwards) and stops the
# daemons it started: meant for a disposable machine or CI, not a cluster.
#
# Where Slurm cannot be started (not root, no package, daemons refuse), it
# says why and launches the RANKS ranks as plain processes with
# SLURM_PROCID / SLURM_NTASKS / SLURM_NODEID set, which is what srun does.
#
# Usage: scripts/slurm-shared-file.sh [--ranks 4] [--size BYTES] [--dir DIR] [--no-slurm]
set -euo pipefail

ranks=4 size=$(( (256 << 20) + 4096 * 3 + 1001 )) dir=${TMPDIR:-/tmp} use_slurm=1
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --no-slurm) use_slurm=0; shift ;;
    *) echo "usage: $0 [--ranks 4] [--size BYTES] [--dir DIR] [--no-slurm]" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
cargo build --release --quiet
pw=$PWD/target/release/pagewriter
work=$(mktemp -d "$dir/pagewriter-slurm.XXXXXX")
chmod 755 "$work"
file=$work/shared.bin
reports=$work/reports
we_started=0
cleanup() {
  if [ "$we_started" = 1 ]; then
    pkill -x slurmctld 2>/dev/null || true; pkill -x slurmd 2>/dev/null || true
    # One name per pgrep: procps matches at most 15 characters of a name.
    for _ in $(seq 1 20); do pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || break; sleep 0.5; done
  fi
  if [ -f "$work/slurm.conf.before" ]; then cp "$work/slurm.conf.before" /etc/slurm/slurm.conf; fi
  rm -rf "$work"
}
trap cleanup EXIT

io_args=(io --shared-file "$file" --size "$size" --rw write --bs 1MiB --iodepth 8
         --numjobs 2 --direct auto --report-dir "$reports")

start_slurm() {
  if [ "$(id -u)" != 0 ]; then echo "not root"; return 1; fi
  if ! command -v srun >/dev/null || ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    echo "installing slurm-wlm and munge from Debian's packages" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) \
      >/dev/null 2>&1 || { echo "apt-get install slurm-wlm munge failed"; return 1; }
  fi
  local host cpus conf=/etc/slurm/slurm.conf
  host=$(hostname -s); cpus=$(nproc)
  mkdir -p /etc/slurm /etc/munge /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /var/log/munge /var/lib/munge
  if [ ! -s /etc/munge/munge.key ]; then
    if command -v mungekey >/dev/null; then mungekey --create --keyfile /etc/munge/munge.key >/dev/null 2>&1
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
  fi
  chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
  if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- /usr/sbin/munged >/dev/null 2>&1 || /usr/sbin/munged --force >/dev/null 2>&1 \
      || { echo "munged does not start"; return 1; }
  fi
  [ -f "$conf" ] && cp "$conf" "$work/slurm.conf.before"
  cat >"$conf" <<EOF
ClusterName=pagewriter
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SchedulerType=sched/builtin
SelectType=select/cons_tres
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  pkill -x slurmctld 2>/dev/null || true
  pkill -x slurmd 2>/dev/null || true
  sleep 0.5
  we_started=1
  /usr/sbin/slurmctld -c -i >/dev/null 2>&1 || { echo "slurmctld does not start"; return 1; }
  /usr/sbin/slurmd >/dev/null 2>&1 || { echo "slurmd does not start"; return 1; }
  for _ in $(seq 1 60); do
    if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then return 0; fi
    sleep 0.5
  done
  echo "the node did not come up: $(sinfo -h -o '%T %E' 2>&1 | head -1)"
  return 1
}

launcher=plain
if [ "$use_slurm" = 1 ]; then
  # Not in a subshell: start_slurm sets we_started.
  if start_slurm >"$work/slurm-why" 2>&1; then launcher=slurm
  else echo "Slurm unavailable ($(tail -1 "$work/slurm-why")): plain processes with SLURM_* set"; fi
else
  echo "--no-slurm: plain processes with SLURM_* set"
fi

echo "$ranks ranks ($launcher), shared file of $size B ($((size % ranks)) B left over by $ranks), $work"
t0=$(date +%s.%N)
if [ "$launcher" = slurm ]; then
  srun -n "$ranks" -O --chdir="$work" "$pw" "${io_args[@]}"
else
  pids=()
  for r in $(seq 0 $((ranks - 1))); do
    SLURM_PROCID=$r SLURM_NTASKS=$ranks SLURM_NODEID=0 "$pw" "${io_args[@]}" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
fi
t1=$(date +%s.%N)
echo "ranks done in $(python3 -c "print('%.2f' % ($t1 - $t0))") s"

"$pw" report "$reports"
"$pw" gen --size "$size" -o "$work/expected.bin"
if cmp "$work/expected.bin" "$file"; then
  echo "verified: all $size bytes of the shared file equal the generator's ($launcher, $ranks ranks)"
else
  echo "FAILED: the shared file differs from the generator's bytes" >&2
  exit 1
fi
