#!/usr/bin/env bash
# Bulk flush of pagewriter against fio with the equivalent job on the same
# file: same size, bs = pagewriter's bytes per write call, same O_DIRECT
# setting, psync for the pwritev engine and io_uring at the same queue depth
# for the io_uring engine, end_fsync=1. Runs alternate (pagewriter, fio,
# pagewriter, fio, ...) so a noisy moment of the machine hits both; prints
# every pair's ratio and the median per case.
#
# Preallocation as pagewriter does it: an O_DIRECT flush by the io_uring
# engine fallocates the batch (inside its timed flush); pwritev, which has
# one write in flight, and buffered flushes do not. So fio runs with
# fallocate=native for the io_uring O_DIRECT job (before its timed phase)
# and fallocate=none for the others (buffered writes into preallocated,
# unwritten extents were 1.0-1.2 GB/s here against 1.6-1.7 without).
# Both sides write a fresh file: the file is removed before each run, and
# pagewriter's warm-up pass writes a temporary file beside it (an
# overwrite of written blocks ran 1.3-1.9x faster than a fresh file here;
# the script stops if pagewriter reports one).
#
# Suite write-file: `pagewriter write-file` (O_DIRECT, io_uring, the
# default 4 MiB buffers at queue depth 4) against fio rw=write with the same
# size, bs, iodepth, direct=1, ioengine=io_uring, fallocate=native and
# end_fsync=1. The file is removed before every run of either, so neither
# pays for freeing the previous file's extents.
#
# Suite io: `pagewriter io` against fio with the same job on the same
# file (written once by `pagewriter write-file`), O_DIRECT, io_uring, no
# fixed buffers or registered files on either side, time-based
# (--io-runtime seconds each): seq read 128 KiB QD128, seq write 1 MiB QD32,
# rand write 4 KiB QD64, rand read 4 KiB QD64. fio runs with
# lat_percentiles=1 so its percentiles are of total latency (submission to
# completion), which is what pagewriter records for every I/O; pagewriter
# writes with --pattern fixed (buffers filled once), as fio does by
# default. Ratios: bandwidth pagewriter / fio (higher is better) and p99
# latency pagewriter / fio (lower is better).
#
# Suite commit: durable commits of --commit-bs bytes (64KiB and 4KiB by
# default) in each file layout of --commit-layouts (growing, preallocated,
# written by default), O_DIRECT, at each thread count of --commit-threads
# (1,8), per mode of --commit-modes and commit kind of --commit-kinds:
#   global    sync() per transaction (every page any thread wrote)
#   scoped    each thread's own Writer::commit (its pages only)
#   through   Writer::write_and_commit: the pages and the commit in one call
#   async:N   Writer::commit_async with N tickets in flight per thread
# pagewriter: `scale --rewrite 0 --pages N --fill fixed --direct on
# --layout L --commit K` (N pages of 4 KiB per transaction, one buffer
# filled once per thread and copied in with a stamp per page, as fio
# reuses its buffers). Anchors, in the same round:
#   fio Tx psync   numjobs = T, each writing bs with O_DIRECT and calling
#                  fdatasync after every write (fio's commit job);
#   streams        the same streams inside scale (`--modes streams`: pwrite
#                  + fdatasync per commit on an O_DIRECT descriptor per
#                  thread, no page writer), each commit timed whole, so p99
#                  and CPU per commit compare like for like (fio reports a
#                  commit's write and sync latency apart);
#   fio io_uring   one job, iodepth = the largest thread count,
#                  fdatasync=1: the nearest fio has to pipelined commits.
# Layouts, the same on both sides:
#   growing       a fresh file (fio: fallocate=none, each job's region
#                 1 GiB apart); every write allocates new blocks.
#   preallocated  blocks reserved before the clock (fio: fallocate=native
#                 over T x 1 GiB; scale --preallocate T GiB).
#   written       1 GiB written and synced before the clock (fio: a
#                 sequential write job lays the file out; its jobs take
#                 1 GiB / T each and wrap around; scale writes its 1 GiB and
#                 wraps around inside it): pure overwrites.
# Ratios per round, then the median of the rounds: commits/s against fio's
# T streams and against the in-process streams; p99 and CPU µs per commit
# against the streams'; a cell at fewer threads also against fio's streams
# at the largest thread count (async at 1 thread against 8 streams); fio's
# own CPU µs per commit against the streams' (usr_cpu + sys_cpu of its
# JSON over its writes). Every CPU figure also prints its user-space part
# (the rest is the kernel's).
# --commit-trace: also time fio's T streams and the in-process streams
# whole, from each thread's write to the end of its fdatasync, with
# bpftrace (scripts/commit-latency.bt; needs bpftrace and root), in one
# extra traced run of each per round, and give fio's whole-commit p99
# against the streams' (both traced, so the probes' cost falls on both):
# whether fio itself reaches a p99 bar, which its JSON cannot say.
# --commit-scale-args: more `pagewriter scale` flags for the commit suite's
# runs, one string (e.g. "--queue-depth 8"); fio's job is unchanged.
#
# Suite flush runs every pass of either tool from the same page-cache state:
# `sync` and, as root, `echo 3 > /proc/sys/vm/drop_caches` before each (the
# buffered cases swung 0.30-1.85 between rounds of one run without it: a
# pass paid for the previous one's writeback). Not root: said once, not
# dropped.
#
# Usage: scripts/compare-fio.sh [--suites flush,write-file,io,commit] [--size 1GiB]
#          [--wf-size 8GiB] [--wf-bs 4MiB] [--wf-qd 4] [--rounds 5]
#          [--io-size 4GiB] [--io-runtime 10] [--dir DIR] [--qd 32]
#          [--commit-seconds 3] [--commit-threads 1,8] [--commit-modes io-uring,vectored]
#          [--commit-layouts growing,preallocated,written] [--commit-bs 64KiB,4KiB]
#          [--commit-kinds global,scoped,through,async:8] [--commit-scale-args "FLAGS"]
#          [--commit-trace]
#   DIR must be on the file system to measure (default: the current one).
set -euo pipefail

size=1GiB rounds=5 dir=. qd=32 bs=1MiB suites=flush,write-file,io,commit plot_dir=""
wf_size=8GiB wf_bs=4MiB wf_qd=4 io_size=4GiB io_runtime=10
commit_seconds=3 commit_threads=1,8 commit_modes=io-uring,vectored commit_files=growing,preallocated,written
commit_bs=64KiB,4KiB commit_scale_args="" commit_kinds=global,scoped,through,async:8 commit_trace=0
usage="usage: $0 [--suites flush,write-file,io,commit] [--size 1GiB] [--wf-size 8GiB] [--wf-bs 4MiB] [--wf-qd 4] [--io-size 4GiB] [--io-runtime 10] [--rounds 5] [--dir DIR] [--qd 32] [--plot DIR] [--commit-seconds 3] [--commit-threads 1,8] [--commit-modes io-uring,vectored] [--commit-layouts growing,preallocated,written] [--commit-bs 64KiB,4KiB] [--commit-kinds global,scoped,through,async:8] [--commit-scale-args \"FLAGS\"] [--commit-trace]"
while [ $# -gt 0 ]; do
  case "$1" in
    --suites) suites=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --wf-size) wf_size=$2; shift 2 ;;
    --wf-bs) wf_bs=$2; shift 2 ;;
    --wf-qd) wf_qd=$2; shift 2 ;;
    --io-size) io_size=$2; shift 2 ;;
    --io-runtime) io_runtime=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --qd) qd=$2; shift 2 ;;
    --plot) plot_dir=$2; shift 2 ;;
    --commit-seconds) commit_seconds=$2; shift 2 ;;
    --commit-threads) commit_threads=$2; shift 2 ;;
    --commit-modes) commit_modes=$2; shift 2 ;;
    --commit-files|--commit-layouts) commit_files=$2; shift 2 ;;
    --commit-bs) commit_bs=$2; shift 2 ;;
    --commit-scale-args) commit_scale_args=$2; shift 2 ;;
    --commit-kinds) commit_kinds=$2; shift 2 ;;
    --commit-trace) commit_trace=1; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
for layout in ${commit_files//,/ }; do
  case $layout in
    preallocated|growing|written) ;;
    *) echo "--commit-layouts: $layout is not growing, preallocated or written" >&2; exit 2 ;;
  esac
done
has_suite() { [[ ",$suites," == *",$1,"* ]]; }
if [ "$commit_trace" = 1 ] && has_suite commit; then
  command -v bpftrace >/dev/null || { echo "--commit-trace: bpftrace is not installed (apt-get install bpftrace)" >&2; exit 2; }
  [ "$(id -u)" = 0 ] || { echo "--commit-trace: bpftrace needs root" >&2; exit 2; }
fi

if ! command -v fio >/dev/null 2>&1; then
  echo "installing fio from Debian's packages" >&2
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq fio >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq fio >/dev/null; fi
fi
command -v python3 >/dev/null || { echo "python3 is needed to read the JSON" >&2; exit 1; }

# fio reads unit suffixes its own way (its "MiB" can mean 10^6); give it bytes.
to_bytes() { python3 -c 'import re,sys
m=re.fullmatch(r"(\d+)\s*([KMGT]?)(i?)B?", sys.argv[1], re.I)
n,u,i=int(m[1]),m[2].upper(),m[3]
print(n*(1024 if i or not u else 1000)**"_KMGT".index(u or "_"))' "$1"; }
size_b=$(to_bytes "$size"); bs_b=$(to_bytes "$bs")
wf_size_b=$(to_bytes "$wf_size"); wf_bs_b=$(to_bytes "$wf_bs"); io_size_b=$(to_bytes "$io_size")

if [ -n "$plot_dir" ]; then
  # Checked before any round runs.
  mkdir -p "$plot_dir" && [ -w "$plot_dir" ] || { echo "--plot $plot_dir: not a writable directory" >&2; exit 2; }
  plot_dir=$(cd "$plot_dir" && pwd)
fi
rounds_log=$(mktemp)
trap 'rm -f "$rounds_log"' EXIT
# record SUITE CASE RATIO...: every round's ratio, for the plots.
record() { local s=$1 c=$2; shift 2; printf '%s\t%s\t%s\n' "$s" "$c" "$*" >>"$rounds_log"; }

cd "$(dirname "$0")/.."
cargo build --release --quiet
pw=$PWD/target/release/pagewriter
file=$(cd "$dir" && pwd)/.pagewriter-compare-fio.pwtmp
trap 'rm -f "$file" "$rounds_log"' EXIT

# name | pagewriter engine | direct | fio ioengine | fio iodepth
cases=(
  "pwritev-buffered|vectored|off|psync|1"
  "pwritev-direct|vectored|on|psync|1"
  "io_uring-buffered|io-uring|off|io_uring|$qd"
  "io_uring-direct|io-uring|on|io_uring|$qd"
)

ours() { # engine direct -> GB/s, CPU s/GB
  # A fresh file, as fio's side gets (the warm-up pass writes beside it).
  rm -f "$file"; sync
  "$pw" flush --size "$size_b" --bs "$bs_b" --engines "$1" --queue-depth "$qd" --direct "$2" \
    --repeats 1 --file "$file" --json |
    python3 -c 'import json,sys
r=json.load(sys.stdin)[0]
assert not r["overwrite"], "the timed pass overwrote a written file; fio writes a fresh one"
print("%.4f %.4f" % (r["gb_per_s"], r["cpu_s_per_gb"]))'
}

# The same page-cache state before every flush pass of either tool.
clean_state() {
  sync
  if [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/drop_caches ]; then
    echo 3 > /proc/sys/vm/drop_caches
  elif [ -z "${clean_warned:-}" ]; then
    clean_warned=1
    echo "not root: page cache not dropped between passes (sync only)" >&2
  fi
}

# fio's CPU seconds per GB of a job (or a group) in its JSON: usr_cpu and
# sys_cpu are percent of one CPU over job_runtime (ms).
fio_cpu='cpu=lambda j, b: (j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] / 1000 / (b / 1e9)'


theirs() { # ioengine iodepth direct(0/1) -> GB/s (bytes / job runtime, end_fsync included),
  # CPU s/GB of the job thread (fio's usr_cpu + sys_cpu), CPU s/GB of the whole fio run
  # (every process and thread, io_uring workers included; setup too)
  local falloc=none out times
  [ "$3" = 1 ] && [ "$1" = io_uring ] && falloc=native
  rm -f "$file"
  out=$(mktemp) times=$(mktemp)
  # bash's `time` reports user and system seconds of fio and its children.
  { TIMEFORMAT='%U %S'; time fio --name=bulk --filename="$file" --size="$size_b" --bs="$bs_b" \
      --rw=write --ioengine="$1" --iodepth="$2" --direct="$3" --end_fsync=1 \
      --fallocate="$falloc" --output-format=json >"$out"; } 2>"$times"
  python3 -c 'import json,sys
'"$fio_cpu"'
j=json.load(open(sys.argv[1]))["jobs"][0]
u, s = map(float, open(sys.argv[2]).read().split()[-2:])
b=j["write"]["io_bytes"]
print("%.4f %.4f %.4f" % (b / (j["job_runtime"] / 1000) / 1e9, cpu(j, b), (u + s) / (b / 1e9)))' "$out" "$times"
  rm -f "$file" "$out" "$times"
}

# cpu_ratio A B -> A / B, or "n/a" where fio reported no CPU time.
cpu_ratio() { python3 -c "import sys; a, b = $1, $2; print('%.3f' % (a / b) if b > 0 else 'n/a')"; }

median() { sort -n | python3 -c 'import sys; v=[float(x) for x in sys.stdin]; n=len(v); print("%.3f" % (v[n//2] if n%2 else (v[n//2-1]+v[n//2])/2))'; }

echo "fio: $(fio --version), $rounds rounds, file $file"
summary=()
if has_suite flush; then
echo "suite flush: size $size ($size_b B), bs $bs ($bs_b B), queue depth $qd"
for c in "${cases[@]}"; do
  IFS='|' read -r name engine direct ioengine depth <<<"$c"
  fdirect=0; [ "$direct" = on ] && fdirect=1
  ratios=() cpu_r=() cpu_w=()
  for r in $(seq 1 "$rounds"); do
    clean_state
    read -r a acpu < <(ours "$engine" "$direct")
    clean_state
    read -r b bcpu bwhole < <(theirs "$ioengine" "$depth" "$fdirect")
    ratio=$(python3 -c "print('%.3f' % ($a / $b))")
    cr=$(cpu_ratio "$acpu" "$bcpu")
    cw=$(cpu_ratio "$acpu" "$bwhole")
    ratios+=("$ratio"); cpu_r+=("$cr"); cpu_w+=("$cw")
    printf '%-18s round %d  pagewriter %7.3f GB/s %6.3f CPU s/GB  fio %7.3f GB/s %6.3f CPU s/GB (whole run %6.3f)  ratio %s  CPU ratio %s (whole run %s)\n' \
      "$name" "$r" "$a" "$acpu" "$b" "$bcpu" "$bwhole" "$ratio" "$cr" "$cw"
  done
  med=$(printf '%s\n' "${ratios[@]}" | median)
  summary+=("$(printf '%-18s median ratio %s  (%s)  median CPU/GB ratio %s, against fio'"'"'s whole run %s' "$name" "$med" "${ratios[*]}" \
    "$(printf '%s\n' "${cpu_r[@]}" | grep -v n/a | median)" "$(printf '%s\n' "${cpu_w[@]}" | grep -v n/a | median)")")
  record flush "$name" "${ratios[@]}"
done
fi

if has_suite write-file; then
echo "suite write-file: size $wf_size ($wf_size_b B), bs $wf_bs ($wf_bs_b B), queue depth $wf_qd, O_DIRECT"
ratios=() cpu_r=()
for r in $(seq 1 "$rounds"); do
  rm -f "$file"; sync
  read -r a acpu < <("$pw" write-file "$file" --size "$wf_size_b" --buffer-size "$wf_bs_b" --queue-depth "$wf_qd" \
        --buffer-count $((wf_qd + 4)) --direct on --engine io-uring --json |
      python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.4f %.4f" % (r["gb_per_s"], r["cpu_s_per_gb"]))')
  rm -f "$file"; sync
  read -r b bcpu < <(fio --name=seqwrite --filename="$file" --size="$wf_size_b" --bs="$wf_bs_b" --rw=write \
        --ioengine=io_uring --iodepth="$wf_qd" --direct=1 --end_fsync=1 --fallocate=native \
        --output-format=json |
      python3 -c 'import json,sys
'"$fio_cpu"'
j=json.load(sys.stdin)["jobs"][0]
b=j["write"]["io_bytes"]
print("%.4f %.4f" % (b / (j["job_runtime"] / 1000) / 1e9, cpu(j, b)))')
  rm -f "$file"
  ratio=$(python3 -c "print('%.3f' % ($a / $b))")
  cr=$(cpu_ratio "$acpu" "$bcpu")
  ratios+=("$ratio"); cpu_r+=("$cr")
  printf '%-18s round %d  pagewriter %7.3f GB/s %6.3f CPU s/GB  fio %7.3f GB/s %6.3f CPU s/GB  ratio %s  CPU ratio %s\n' \
    write-file "$r" "$a" "$acpu" "$b" "$bcpu" "$ratio" "$cr"
done
med=$(printf '%s\n' "${ratios[@]}" | median)
summary+=("$(printf '%-18s median ratio %s  (%s)  median CPU/GB ratio %s (%s)' write-file "$med" "${ratios[*]}" \
  "$(printf '%s\n' "${cpu_r[@]}" | grep -v n/a | median)" "${cpu_r[*]}")")
record write-file write-file "${ratios[@]}"
fi
if has_suite io; then
echo "suite io: file $io_size ($io_size_b B), ${io_runtime}s per run, O_DIRECT, io_uring"
rm -f "$file"
"$pw" write-file "$file" --size "$io_size_b" >/dev/null
# name | rw | bs | iodepth
io_cases=(
  "seqread-128k-qd128|read|131072|128"
  "seqwrite-1m-qd32|write|1048576|32"
  "randwrite-4k-qd64|randwrite|4096|64"
  "randread-4k-qd64|randread|4096|64"
)
for c in "${io_cases[@]}"; do
  IFS='|' read -r name rw cbs depth <<<"$c"
  dir_key=write; case "$rw" in *read) dir_key=read ;; esac
  bw_r=() p99_r=() cpu_r=()
  fio_json=$(mktemp)
  for r in $(seq 1 "$rounds"); do
    # The last round draws the latency curve, beside fio's of the round before.
    plot_args=()
    if [ -n "$plot_dir" ] && [ "$r" = "$rounds" ]; then
      plot_args=(--plot "$plot_dir/io-$name-latency.svg")
      [ -s "$fio_json" ] && plot_args+=(--reference "$fio_json")
    fi
    read -r a ap99 acpu < <("$pw" io --filename "$file" --rw "$rw" --bs "$cbs" --iodepth "$depth" \
        --direct on --size "$io_size_b" --runtime "$io_runtime" --pattern fixed --json "${plot_args[@]}" |
      python3 -c 'import json,sys
r=json.load(sys.stdin); d=r["'$dir_key'"]
print("%.1f %.1f %.4f" % (d["bw_bytes_per_s"], d["lat_us"]["p99"], r["cpu_s"] / (d["bytes"] / 1e9)))')
    read -r b bp99 bcpu < <(fio --name="$name" --filename="$file" --rw="$rw" --bs="$cbs" --iodepth="$depth" \
        --direct=1 --ioengine=io_uring --size="$io_size_b" --runtime="$io_runtime" --time_based \
        --lat_percentiles=1 --output-format=json | tee "$fio_json" |
      python3 -c 'import json,sys
'"$fio_cpu"'
j=json.load(sys.stdin)["jobs"][0]; d=j["'$dir_key'"]
print("%.1f %.1f %.4f" % (d["bw_bytes"], d["lat_ns"]["percentile"]["99.000000"] / 1e3, cpu(j, d["io_bytes"])))')
    ratio=$(python3 -c "print('%.3f' % ($a / $b))")
    pratio=$(python3 -c "print('%.3f' % ($ap99 / $bp99))")
    cr=$(cpu_ratio "$acpu" "$bcpu")
    bw_r+=("$ratio"); p99_r+=("$pratio"); cpu_r+=("$cr")
    printf '%-18s round %d  pagewriter %8.3f GB/s p99 %8.1f us %6.3f CPU s/GB  fio %8.3f GB/s p99 %8.1f us %6.3f CPU s/GB  bw ratio %s  p99 ratio %s  CPU ratio %s\n' \
      "$name" "$r" "$(python3 -c "print($a/1e9)")" "$ap99" "$acpu" "$(python3 -c "print($b/1e9)")" "$bp99" "$bcpu" "$ratio" "$pratio" "$cr"
  done
  summary+=("$(printf '%-18s median bw ratio %s (%s)  median p99 ratio %s (%s)  median CPU/GB ratio %s' "$name" \
    "$(printf '%s\n' "${bw_r[@]}" | median)" "${bw_r[*]}" "$(printf '%s\n' "${p99_r[@]}" | median)" "${p99_r[*]}" \
    "$(printf '%s\n' "${cpu_r[@]}" | grep -v n/a | median)")")
  record io "$name bw" "${bw_r[@]}"
  record io "$name p99" "${p99_r[@]}"
  rm -f "$fio_json"
done
rm -f "$file"
fi

if has_suite commit; then
echo "suite commit: ${commit_seconds}s per run, O_DIRECT, bs $commit_bs, threads $commit_threads, modes $commit_modes, kinds $commit_kinds, layouts $commit_files"
scale_dir=$(cd "$dir" && pwd)
# scale's layout flags for a layout and thread count.
scale_layout() {
  case $1 in
    growing) echo "--layout growing" ;;
    preallocated) echo "--layout preallocated --preallocate ${2}GiB" ;;
    written) echo "--layout written --preallocate 1GiB" ;;
  esac
}
# fio's commit job on the layout (the file laid out first for `written`):
# psync with fdatasync after every write, `jobs` streams; or, with
# engine io_uring, one job at iodepth `jobs` with fdatasync=1.
fio_commit() { # layout jobs bs_bytes [io_uring] -> commits/s p99_us cpu_us_per_commit user_us_per_commit
  local layout=$1 t=$2 b=$3 engine=${4:-psync} falloc=none region=1G inc=1G nj=$2 qd=1
  [ "$engine" = io_uring ] && nj=1 qd=$t
  rm -f "$file"
  case $layout in
    preallocated) falloc=native ;;
    written)
      fio --name=layout --filename="$file" --rw=write --bs=1M --direct=1 --ioengine=psync \
        --size=1G --end_fsync=1 --output=/dev/null
      region=$((1024 / nj))M inc=$((1024 / nj))M ;;
  esac
  fio --name=commit --filename="$file" --rw=write --bs="$b" --direct=1 \
      --ioengine="$engine" --iodepth="$qd" --fdatasync=1 --numjobs="$nj" --offset_increment="$inc" \
      --size="$region" --fallocate="$falloc" --time_based --runtime="$commit_seconds" \
      --group_reporting --output-format=json |
    python3 -c 'import json,sys
j=json.load(sys.stdin)["jobs"][0]
p=lambda d: d["percentile"]["99.000000"] / 1e3
# usr_cpu and sys_cpu are percent of job_runtime (ms, summed over the
# jobs with group_reporting): CPU µs per commit = that time / writes.
cpu = lambda pct: pct / 100 * j["job_runtime"] * 1e3 / max(j["write"]["total_ios"], 1)
print("%.1f %.1f %.2f %.2f" % (j["write"]["iops"], p(j["write"]["clat_ns"]) + p(j["sync"]["lat_ns"]),
      cpu(j["usr_cpu"] + j["sys_cpu"]), cpu(j["usr_cpu"])))'
  rm -f "$file"
}
# One scale cell: mode, commit kind, threads, layout, pages ->
# commits/s p99_us cpu_us_per_commit syncs_per_commit writes_per_commit user_us_per_commit
scale_commit() {
  local lay
  read -r -a lay < <(scale_layout "$4" "$3")
  "$pw" scale --rewrite 0 --pages "$5" --page-size 4096 --threads "$3" \
      --modes "$1" --commit "$2" --duration "$commit_seconds" --repeats 1 --direct on \
      --path "$scale_dir" --fill fixed "${lay[@]}" --queue-depth "$qd" "${commit_extra[@]}" --json |
    python3 -c 'import json,sys
r=json.load(sys.stdin)["rows"][0]
print("%.1f %.1f %.2f %.3f %.3f %.2f" % (r["commits_per_s"], r["p99_us"], r["cpu_us_per_commit"],
      r["syncs_per_commit"], r["write_calls_per_commit"], r["cpu_user_us_per_commit"]))'
}
ratio() { python3 -c "a, b = $1, $2; print('%.3f' % (a / b) if b > 0 else 'n/a')"; }
# traced COMM CMD...: runs CMD with scripts/commit-latency.bt timing the
# commits of threads named COMM, and prints CMD's line followed by the
# whole-commit p99 (µs, bucket's upper edge) and the number of commits
# timed. bpftrace gets 3 s to attach first and is stopped when CMD ends.
traced() {
  local comm=$1 out pid line i state; shift
  out=$(mktemp)
  bpftrace scripts/commit-latency.bt "$comm" -o "$out" >/dev/null 2>&1 &
  pid=$!
  sleep 3
  line=$("$@")
  # A SIGINT that lands while bpftrace sets itself up can be lost: repeat.
  for i in $(seq 20); do
    kill -INT "$pid" 2>/dev/null || break
    sleep 0.5
    state=$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    if [ -z "$state" ] || [ "$state" = Z ]; then break; fi
  done
  wait "$pid" || true
  echo "$line $(python3 - "$out" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
buckets = [(int(m[2]), int(m[3])) for m in re.finditer(r"\[(\d+), (\d+)\)\s+(\d+)", text)]
over = re.search(r"\[(\d+), \.\.\.\)\s+(\d+)", text)
total = sum(c for _, c in buckets) + (int(over[2]) if over else 0)
seen, p99 = 0, "n/a"
for hi, c in buckets:
    seen += c
    if total and seen >= 0.99 * total:
        p99 = hi
        break
print(p99, total)
PY
)"
  rm -f "$out"
}
read -r -a commit_extra <<< "$commit_scale_args"
[ -z "$commit_scale_args" ] || echo "scale flags added: $commit_scale_args"
max_t=$(tr ',' '\n' <<<"$commit_threads" | sort -n | tail -1)
for cbs in ${commit_bs//,/ }; do
  cbs_b=$(to_bytes "$cbs")
  pages=$((cbs_b / 4096))
  [ "$pages" -ge 1 ] && [ $((pages * 4096)) -eq "$cbs_b" ] || { echo "--commit-bs $cbs: not a whole number of 4 KiB pages" >&2; exit 2; }
  for layout in ${commit_files//,/ }; do
    # Every cell of a round runs between the same round's anchors, so the
    # disk's drift falls on all of them; ratios are per round, then the
    # median of the rounds.
    unset R; declare -A R=()
    for r in $(seq 1 "$rounds"); do
      declare -A fio_c=() fio_p=() st_c=() st_p=() st_u=()
      for t in ${commit_threads//,/ }; do
        read -r fio_c[$t] fio_p[$t] fio_cpu fio_usr < <(fio_commit "$layout" "$t" "$cbs_b")
        read -r st_c[$t] st_p[$t] st_u[$t] _ _ st_usr < <(scale_commit streams global "$t" "$layout" "$pages")
        printf '%-28s round %d  fio %dx psync %8.0f commits/s p99 %7.1f us CPU %6.1f (user %5.1f) us/commit   streams %8.0f commits/s p99 %7.1f us CPU %6.1f (user %5.1f) us/commit\n' \
          "$cbs-$layout-${t}thr" "$r" "$t" "${fio_c[$t]}" "${fio_p[$t]}" "$fio_cpu" "$fio_usr" "${st_c[$t]}" "${st_p[$t]}" "${st_u[$t]}" "$st_usr"
        R["streams-${t}thr vs fio"]+="$(ratio "${st_c[$t]}" "${fio_c[$t]}") "
        R["fio-${t}x CPU vs streams"]+="$(ratio "$fio_cpu" "${st_u[$t]}") "
        if [ "$commit_trace" = 1 ]; then
          # fio's and the streams' commits timed whole by the same probes.
          # A trace that timed fewer than 95% of the commits the run made
          # (bpftrace attached late) gives no ratio.
          read -r tf_c _ _ _ tf_p tf_n < <(traced fio fio_commit "$layout" "$t" "$cbs_b")
          read -r ts_c _ _ _ _ _ ts_p ts_n < <(traced "$(basename "$pw")" scale_commit streams global "$t" "$layout" "$pages")
          tr_ratio=n/a
          if python3 -c "import sys; sys.exit(not ($tf_n >= 0.95 * $tf_c * $commit_seconds and $ts_n >= 0.95 * $ts_c * $commit_seconds and '$tf_p' != 'n/a' and '$ts_p' != 'n/a'))"; then
            tr_ratio=$(ratio "$tf_p" "$ts_p")
          fi
          printf '%-28s round %d  traced whole commits: fio %dx p99 %s us (%s timed, %.0f commits/s)  streams p99 %s us (%s timed, %.0f commits/s)  ratio %s\n' \
            "$cbs-$layout-${t}thr" "$r" "$t" "$tf_p" "$tf_n" "$tf_c" "$ts_p" "$ts_n" "$ts_c" "$tr_ratio"
          R["fio-${t}x whole p99 vs streams (traced)"]+="$tr_ratio "
        fi
      done
      read -r fio_u fio_up _ _ < <(fio_commit "$layout" "$max_t" "$cbs_b" io_uring)
      printf '%-28s round %d  fio io_uring iodepth %d fdatasync=1: %8.0f commits/s p99 %7.1f us\n' \
        "$cbs-$layout" "$r" "$max_t" "$fio_u" "$fio_up"
      R["fio-io_uring-qd$max_t vs fio ${max_t}x"]+="$(ratio "$fio_u" "${fio_c[$max_t]}") "
      for t in ${commit_threads//,/ }; do
        for mode in ${commit_modes//,/ }; do
          for kind in ${commit_kinds//,/ }; do
            name="$mode-$kind-${t}thr"
            read -r a ap au as aw ausr < <(scale_commit "$mode" "$kind" "$t" "$layout" "$pages")
            printf '%-28s round %d  %-30s %8.0f commits/s p99 %7.1f us CPU %6.1f (user %5.1f) us/commit  %.2f syncs %.2f writes/commit\n' \
              "$cbs-$layout-${t}thr" "$r" "$mode $kind" "$a" "$ap" "$au" "$ausr" "$as" "$aw"
            R["$name vs fio ${t}x"]+="$(ratio "$a" "${fio_c[$t]}") "
            R["$name vs streams"]+="$(ratio "$a" "${st_c[$t]}") "
            R["$name p99 vs streams"]+="$(ratio "$ap" "${st_p[$t]}") "
            R["$name CPU vs streams"]+="$(ratio "$au" "${st_u[$t]}") "
            if [ "$t" != "$max_t" ]; then
              R["$name vs fio ${max_t}x"]+="$(ratio "$a" "${fio_c[$max_t]}") "
            fi
          done
        done
      done
    done
    for key in $(printf '%s\n' "${!R[@]}" | tr ' ' '~' | sort); do
      k=${key//\~/ }
      read -r -a v <<<"${R[$k]}"
      summary+=("$(printf 'commit %-6s %-12s %-40s median %s (%s)' "$cbs" "$layout" "$k" \
        "$(printf '%s\n' "${v[@]}" | grep -v n/a | median)" "${v[*]}")")
      record commit "$cbs $layout $k" "${v[@]}"
    done
    unset R
  done
done
fi

echo
printf '%s\n' "${summary[@]}"

if [ -n "$plot_dir" ]; then
  # One SVG per suite: every round's ratio per case.
  for suite in $(cut -f1 "$rounds_log" | sort -u); do
    json="$plot_dir/$suite-rounds.json"
    python3 - "$rounds_log" "$suite" "$rounds" >"$json" <<'PY'
import json, sys
log, suite, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
cases = {}
for line in open(log):
    s, case, ratios = line.rstrip("\n").split("\t")
    if s == suite:
        cases[case] = [float(r) for r in ratios.split()]
print(json.dumps({"title": f"compare-fio {suite}: pagewriter / fio per round ({rounds} rounds)", "cases": cases}))
PY
    "$pw" plot-rounds "$json" --plot "$plot_dir/$suite.svg"
  done
fi

