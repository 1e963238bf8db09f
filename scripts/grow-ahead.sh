#!/usr/bin/env bash
# Grow-ahead against the layouts it stands in for: `pagewriter scale` on a
# growing file without a window, the same with a window, and a written
# file (pure overwrites: the rate grow-ahead aims at), the arms rotated
# every round so a noisy moment hits each; beside them fio's write +
# fdatasync job on a fresh file (each write allocates), the same shape.
# Prints per commit size and thread count the medians (commits/s) and the
# median of the per-round ratios to the written layout.
#
# Usage: scripts/grow-ahead.sh DIR [ROUNDS=3] [SECONDS=2] [WINDOW=64MiB]
#   DIR: a directory on the disk to measure (files are made and removed).
#   SCALE_ARGS: more `scale` flags for every arm (e.g. "--direct off").
#   Needs fio for its column (skipped with a note where missing).
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
dir=$1 rounds=${2:-3} secs=${3:-2} window=${4:-64MiB}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/target/release/pagewriter
[ -x "$bin" ] || (cd "$root" && cargo build --release --locked -q)
read -r -a extra <<<"${SCALE_ARGS:-}"
out=$(mktemp -d)
trap 'rm -rf "$out"; rm -f "$dir"/grow-ahead-fio.dat' EXIT

arms=(off window written)
args_off=(--layout growing)
args_window=(--layout growing --grow-ahead "$window")
args_written=(--layout written --preallocate 1GiB)

fio_fresh() { # threads bs -> commits/s
  local f=$dir/grow-ahead-fio.dat
  rm -f "$f"
  fio --name=commit --filename="$f" --rw=write --bs="$2" --direct=1 --ioengine=psync \
    --fdatasync=1 --numjobs="$1" --offset_increment=1G --size=1G --fallocate=none \
    --time_based --runtime="$secs" --group_reporting --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print("%.0f" % json.load(sys.stdin)["jobs"][0]["write"]["iops"])'
  rm -f "$f"
}

have_fio=1
command -v fio >/dev/null || { have_fio=0; echo "fio not found: its column is left out" >&2; }
for r in $(seq 1 "$rounds"); do
  for pages in 1 16; do
    # Rotate the arms: round r starts at arm r mod 3.
    for k in 0 1 2; do
      arm=${arms[$(((r + k) % 3))]}
      declare -n a="args_$arm"
      "$bin" scale --threads 1,8 --modes io-uring --pages "$pages" --page-size 4096 \
        --rewrite 0 --duration "$secs" --repeats 1 --path "$dir" --json "${a[@]}" "${extra[@]}" \
        2>/dev/null >"$out/$arm.$pages.$r.json"
      unset -n a
    done
    if (( have_fio )); then
      for t in 1 8; do
        fio_fresh "$t" $((pages * 4))k >"$out/fio.$pages.$t.$r"
      done
    fi
  done
done

python3 - "$out" "$rounds" "$have_fio" <<'PY'
import json, os, statistics as st, sys
out, rounds, have_fio = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
def rate(arm, pages, r, threads):
    for row in json.load(open(f"{out}/{arm}.{pages}.{r}.json"))["rows"]:
        if row["threads"] == threads:
            return row["commits_per_s"]
    raise SystemExit(f"no row for {threads} threads in {arm} {pages} {r}")
print(f"{'commit':>7} {'threads':>7} {'growing':>9} {'window':>9} {'written':>9} {'fio fresh':>9}"
      f"  {'window/written':>14} {'growing/written':>15} {'window/fio':>10}")
for pages in (1, 16):
    for t in (1, 8):
        v = {arm: [rate(arm, pages, r, t) for r in range(1, rounds + 1)] for arm in ("off", "window", "written")}
        fio = [float(open(f"{out}/fio.{pages}.{t}.{r}").read()) for r in range(1, rounds + 1)] if have_fio else []
        ratio = lambda a, b: st.median(x / y for x, y in zip(v[a], b))
        wf = f"{st.median(x / y for x, y in zip(v['window'], fio)):10.2f}" if fio else f"{'n/a':>10}"
        print(f"{pages * 4:>5}Ki {t:>7} {st.median(v['off']):9.0f} {st.median(v['window']):9.0f}"
              f" {st.median(v['written']):9.0f} {st.median(fio) if fio else float('nan'):9.0f}"
              f"  {ratio('window', v['written']):14.2f} {ratio('off', v['written']):15.2f} {wf}")
PY
