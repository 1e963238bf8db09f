#!/usr/bin/env bash
# redb on pagewriter against redb's own file backend: durable commits/s
# (16 rows x 1 KiB per transaction, 1 and 8 threads, interleaved rounds,
# median) and system calls per commit from `strace -c -f`.
#
#   scripts/redb-compare.sh [--dir DIR] [--seconds S] [--rounds N] [--txns N]
#
# DIR must be on the file system to measure (default: a scratch directory
# under the current one); it is removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

dir="" seconds=3 rounds=3 txns=3000
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --txns) txns="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
command -v strace >/dev/null || { echo "strace is needed (apt-get install -y strace)" >&2; exit 1; }
if [ -z "$dir" ]; then dir=$(mktemp -d "$PWD/.redb-compare.XXXXXX"); else mkdir -p "$dir"; dir=$(mktemp -d "$dir/.redb-compare.XXXXXX"); fi
trap 'rm -rf "$dir"' EXIT INT TERM

cargo build --release --locked -q -p pagewriter-redb --example redb_commits
bin=target/release/examples/redb_commits

echo "## durable commits/s (median of $rounds interleaved rounds of ${seconds} s)"
"$bin" compare "$dir" "$seconds" "$rounds"

echo
echo "## system calls per commit (strace -c -f, $txns commits)"
echo "| backend | threads | write calls | of which | fdatasync | pread |"
echo "|---|---|---|---|---|---|"
for threads in 1 8; do
  for backend in redb pagewriter; do
    out="$dir/strace-$backend-$threads.txt"
    strace -c -f -o "$out" "$bin" run "$dir" "$backend" "$threads" "$txns" 2>/dev/null
    awk -v b="$backend" -v t="$threads" -v n="$txns" '
      $NF ~ /^(pwrite64|pwritev|pwritev2|write|io_uring_enter|fdatasync|fsync|pread64|preadv)$/ {
        c[$NF] = $4
      }
      END {
        w = c["pwrite64"] + c["pwritev"] + c["pwritev2"] + c["io_uring_enter"]
        split("pwrite64 pwritev io_uring_enter", names, " "); parts = ""
        for (i = 1; i <= 3; i++) if (c[names[i]] > 0) parts = parts sprintf("%s%s %.2f", parts == "" ? "" : ", ", names[i], c[names[i]] / n)
        printf "| %s | %d | %.2f | %s | %.2f | %.2f |\n", b, t, w / n, parts, (c["fdatasync"] + c["fsync"]) / n, (c["pread64"] + c["preadv"]) / n
      }' "$out"
  done
done
