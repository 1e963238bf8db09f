#!/usr/bin/env bash
# Durable commits through the public API (scripts/commit-api: write_all_at
# from each thread's own unaligned buffer, then sync(), Writer::commit or
# Writer::commit_async tickets), this checkout against another one
# (--base TREE) and fio's independent write + fdatasync streams in the
# same file layout, alternating run by run.
#
# Each of T threads writes its own 512 MiB region of one O_DIRECT file in
# order, --bs bytes per commit. Layouts:
#   fresh       a new file: every write allocates (fio: fallocate=none)
#   fallocated  blocks reserved before the clock, unwritten extents each
#               write converts (fallocate(1); fio: fallocate=native)
#   written     an 8 x 512 MiB file written and synced once, reused: pure
#               overwrites (fio: the same file)
# fio's job: T psync streams, fdatasync after every write, each its own
# 512 MiB region (offset_increment), as many threads as the cell.
#
# Prints every run, then per cell the median over rounds of new/base and
# new/fio (commits/s), and geometric means over the cells.
#
# Usage: scripts/commit-api.sh [--base TREE] [--rounds 3] [--seconds 2]
#          [--dir DIR] [--threads 1,8] [--bs 65536,4096]
#          [--layouts fresh,fallocated,written] [--kinds sync,scoped,tickets]
#          [--no-fio] [--tickets 8]
set -euo pipefail
cd "$(dirname "$0")/.."
base="" rounds=3 seconds=2 dir=. threads=1,8 bss=65536,4096 layouts=fresh,fallocated,written
kinds=sync,scoped,tickets fio=1 tickets=8
while [ $# -gt 0 ]; do
  case $1 in
    --base) base=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --bs) bss=$2; shift 2 ;;
    --layouts) layouts=$2; shift 2 ;;
    --kinds) kinds=$2; shift 2 ;;
    --tickets) tickets=$2; shift 2 ;;
    --no-fio) fio=0; shift ;;
    *) echo "usage: see the top of $0" >&2; exit 2 ;;
  esac
done
[ "$fio" = 0 ] || command -v fio >/dev/null || { echo "fio is not installed (apt-get install fio), or pass --no-fio" >&2; exit 2; }
command -v fallocate >/dev/null || { echo "fallocate(1) (util-linux) is needed" >&2; exit 2; }
region=$((512 << 20))
work=$(mktemp -d "$(cd "$dir" && pwd)/commit-api.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

# Builds the harness against the core at $1 into $2 (a copy whose path
# dependency points there).
build() {
  local tree src
  tree=$(cd "$1" && pwd)
  src="$work/src-$2"
  mkdir -p "$src"
  cp -r scripts/commit-api/src "$src/"
  sed "s|^pagewriter = { path = .*|pagewriter = { path = \"$tree\" }|" scripts/commit-api/Cargo.toml >"$src/Cargo.toml"
  CARGO_TARGET_DIR="$work/target-$2" cargo build --release --quiet --manifest-path "$src/Cargo.toml" >&2
  echo "$work/target-$2/release/commit-api"
}
new=$(build . new)
old=""
[ -z "$base" ] || old=$(build "$base" base)

file="$work/commit.dat"
written="$work/written.dat"
max_t=$(tr ',' '\n' <<<"$threads" | sort -n | tail -1)
if [[ ",$layouts," == *,written,* ]]; then
  echo "laying out $written ($max_t x 512 MiB, written and synced)" >&2
  dd if=/dev/zero of="$written" bs=1M count=$((max_t * 512)) oflag=direct conv=fsync status=none
fi
# prep LAYOUT T -> the path to use
prep() {
  case $1 in
    fresh) rm -f "$file"; echo "$file" ;;
    fallocated) rm -f "$file"; fallocate -l $(($2 * region)) "$file"; echo "$file" ;;
    written) echo "$written" ;;
  esac
}
harness() { # binary layout T bs kind -> commits/s p99 commits
  local path; path=$(prep "$2" "$3")
  "$1" --path "$path" --threads "$3" --bs "$4" --kind "$5" --seconds "$seconds" \
    --region "$region" --tickets "$tickets"
  [ "$2" = written ] || rm -f "$file"
}
fio_streams() { # layout T bs -> commits/s
  local path falloc=none
  [ "$1" = fallocated ] && falloc=native
  if [ "$1" = written ]; then path=$written; else rm -f "$file"; path=$file; fi
  fio --name=commit --filename="$path" --rw=write --bs="$3" --direct=1 --ioengine=psync \
    --fdatasync=1 --numjobs="$2" --offset_increment="$region" --size="$region" \
    --fallocate="$falloc" --time_based --runtime="$seconds" --group_reporting \
    --output-format=json | python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["jobs"][0]["write"]["iops"])'
  [ "$1" = written ] || rm -f "$file"
}

log="$work/runs.tsv"
: >"$log"
for r in $(seq 1 "$rounds"); do
  for layout in ${layouts//,/ }; do
    for bs in ${bss//,/ }; do
      for t in ${threads//,/ }; do
        cell="$layout-$bs-${t}thr"
        if [ "$fio" = 1 ]; then
          f=$(fio_streams "$layout" "$t" "$bs")
          printf '%s\tround %d\tfio %dx psync\t%s\n' "$cell" "$r" "$t" "$f" >&2
          printf '%s\t%d\tfio\t-\t%s\n' "$cell" "$r" "$f" >>"$log"
        fi
        for kind in ${kinds//,/ }; do
          # Alternate which build goes first, round by round.
          order="new old"
          [ $((r % 2)) = 0 ] && order="old new"
          for which in $order; do
            bin=$new; [ "$which" = old ] && bin=$old
            [ -n "$bin" ] || continue
            read -r c p n < <(harness "$bin" "$layout" "$t" "$bs" "$kind")
            printf '%s\tround %d\t%s %s\t%s commits/s p99 %s us (%s commits)\n' "$cell" "$r" "$which" "$kind" "$c" "$p" "$n" >&2
            printf '%s\t%d\t%s\t%s\t%s\t%s\n' "$cell" "$r" "$which" "$kind" "$c" "$p" >>"$log"
          done
        done
      done
    done
  done
done
cp "$log" "$(cd "$dir" && pwd)/commit-api-runs.tsv"
python3 - "$log" <<'PY'
import math, statistics, sys
from collections import defaultdict
runs = defaultdict(dict)  # (cell, round) -> {(which, kind): commits/s}
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    runs[(f[0], f[1])][(f[2], f[3])] = float(f[4])
ratios = defaultdict(list)
for (cell, _), m in runs.items():
    fio = m.get(("fio", "-"))
    for (which, kind), c in m.items():
        if which != "new":
            continue
        if ("old", kind) in m:
            ratios[("vs base", kind, cell)].append(c / m[("old", kind)])
        if fio:
            ratios[("vs fio", kind, cell)].append(c / fio)
        if ("old", kind) in m and fio:
            ratios[("base vs fio", kind, cell)].append(m[("old", kind)] / fio)
by = defaultdict(list)
for (what, kind, cell), v in sorted(ratios.items()):
    med = statistics.median(v)
    by[(what, kind)].append(med)
    by[(what, "all")].append(med)
    print(f"{what:12} {kind:8} {cell:24} median {med:.3f}  ({' '.join(f'{x:.2f}' for x in v)})")
print()
for (what, kind), v in sorted(by.items()):
    g = math.exp(sum(math.log(x) for x in v) / len(v))
    print(f"{what:12} {kind:8} geomean {g:.3f} min {min(v):.3f} over {len(v)} cells")
PY
