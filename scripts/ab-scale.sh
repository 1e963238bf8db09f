#!/usr/bin/env bash
# A/B of two `pagewriter` binaries (or one binary and two sets of flags)
# on `scale`: runs them alternately, the order swapped every round (base
# then new in odd rounds, new then base in even ones), so a noisy moment of
# the machine, or the position in a pair, hits both; prints per cell the
# medians and the median of the per-round ratios new / base (commits/s,
# and CPU seconds per GB written, where lower is better).
#
# Usage: [BASE_ARGS=..] [NEW_ARGS=..] scripts/ab-scale.sh BASE_BIN NEW_BIN ROUNDS [scale args...]
#   e.g. git worktree add /tmp/base <rev> && (cd /tmp/base && cargo build --release)
#        scripts/ab-scale.sh /tmp/base/target/release/pagewriter target/release/pagewriter 7 \
#          --threads 1,8 --modes vectored,io-uring --duration 1 --path /some/dir
#   or one binary, a flag on one side:
#        NEW_ARGS="--read-cache 64MiB" scripts/ab-scale.sh target/release/pagewriter \
#          target/release/pagewriter 9 --threads 1 --modes vectored --rewrite 0 --path /some/dir
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
base=$1 new=$2 rounds=$3; shift 3
read -r -a base_args <<<"${BASE_ARGS:-}"
read -r -a new_args <<<"${NEW_ARGS:-}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run_base() { "$base" scale --repeats 1 --json "$@" "${base_args[@]}" 2>/dev/null >"$out/base.$r.json"; }
run_new() { "$new" scale --repeats 1 --json "$@" "${new_args[@]}" 2>/dev/null >"$out/new.$r.json"; }
for r in $(seq 1 "$rounds"); do
  if (( r % 2 )); then run_base "$@"; run_new "$@"; else run_new "$@"; run_base "$@"; fi
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics as st, sys
out, rounds = sys.argv[1], int(sys.argv[2])
cells = {}
for side in ("base", "new"):
    for r in range(1, rounds + 1):
        for row in json.load(open(f"{out}/{side}.{r}.json"))["rows"]:
            cell = cells.setdefault((row["mode"], row["threads"]), {"base": [], "new": [], "base_cpu": [], "new_cpu": []})
            cell[side].append(row["commits_per_s"])
            cell[side + "_cpu"].append(row["cpu_s_per_gb"])
for (mode, threads), v in sorted(cells.items()):
    ratios = [n / b for n, b in zip(v["new"], v["base"])]
    cpu = [n / b for n, b in zip(v["new_cpu"], v["base_cpu"]) if b > 0]
    cpu_txt = f"  CPU/GB ratio {st.median(cpu):.3f}" if cpu else ""
    print(f"{mode:14s} {threads:2d} threads  base {st.median(v['base']):8.0f}  new {st.median(v['new']):8.0f} commits/s"
          f"  median ratio {st.median(ratios):.3f} (rounds {min(ratios):.2f}-{max(ratios):.2f}){cpu_txt}")
PY
