#!/usr/bin/env bash
# The cost of torn-page protection (README "Torn pages"): `scale` with
# --torn-writes allow, atomic, doublewrite, and "second write" (allow with
# 32 pages per transaction, the 16 extra being rewrites scattered over the
# file: what writing every page a second time in place would cost), on
# each directory given, every mode in turn inside each round (the order
# reversed in even rounds). Prints per file system, thread count and
# engine the median commits/s of allow, the median of the per-round
# ratios of every other mode to allow, KiB and fdatasyncs per commit, and
# in how many round-cells doublewrite beat the second write. A mode the
# file system refuses (atomic on ext4) shows as "refused".
#
# Usage: scripts/torn-writes.sh BIN ROUNDS LABEL=DIR [LABEL=DIR ...] [-- scale args...]
#   e.g. scripts/torn-writes.sh target/release/pagewriter 7 XFS=/mnt/xfs ext4=/mnt/ext4
# Defaults after --: --threads 1,8 --modes vectored,io-uring --direct on --duration 1.5
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,16p' "$0" >&2; exit 2; }
bin=$1 rounds=$2; shift 2
dirs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    *=*) [ -d "${1#*=}" ] || { echo "not a directory: ${1#*=}" >&2; exit 2; }; dirs+=("$1") ;;
    *) echo "expected LABEL=DIR, got $1" >&2; exit 2 ;;
  esac
  shift
done
[ $# -gt 0 ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--threads 1,8 --modes vectored,io-uring --direct on --duration 1.5)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
modes=(allow atomic doublewrite second-write)
run() { # label dir mode round
  local extra=(--torn-writes "$3")
  [ "$3" = second-write ] && extra=(--torn-writes allow --pages 32 --rewrite 0.5625)
  if ! "$bin" scale --path "$2" --repeats 1 --json "${args[@]}" "${extra[@]}" \
      >"$out/$1.$3.$4.json" 2>"$out/$1.$3.$4.err"; then
    rm -f "$out/$1.$3.$4.json"
    if [ "$3" != atomic ]; then cat "$out/$1.$3.$4.err" >&2; exit 1; fi
  fi
}
for r in $(seq 1 "$rounds"); do
  order=("${modes[@]}")
  (( r % 2 )) || order=(second-write doublewrite atomic allow)
  for d in "${dirs[@]}"; do
    for m in "${order[@]}"; do run "${d%%=*}" "${d#*=}" "$m" "$r"; done
  done
done
labels=(); for d in "${dirs[@]}"; do labels+=("${d%%=*}"); done
python3 - "$out" "$rounds" "${labels[@]}" <<'PY'
import json, os, statistics as st, sys
out, rounds, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
modes = ["allow", "atomic", "doublewrite", "second-write"]
rows = {}  # (label, mode, round) -> {(threads, engine): row}
for lab in labels:
    for m in modes:
        for r in range(1, rounds + 1):
            p = f"{out}/{lab}.{m}.{r}.json"
            if os.path.exists(p):
                rows[(lab, m, r)] = {(x["threads"], x["mode"]): x for x in json.load(open(p))["rows"]}
if not rows:
    sys.exit("no cell ran")
print("| fs | threads | engine | allow commits/s | atomic | doublewrite | second write "
      "| KiB/commit allow / doublewrite / second write | syncs/commit allow / doublewrite |")
print("|---|---|---|---|---|---|---|---|---|")
wins = cells = 0
for lab in labels:
    keys = sorted({k for (l, m, r), v in rows.items() if l == lab for k in v})
    for k in keys:
        def per(m):
            return {r: rows[(lab, m, r)][k] for r in range(1, rounds + 1)
                    if (lab, m, r) in rows and k in rows[(lab, m, r)]}
        allow = per("allow")
        if not allow:
            continue
        def ratio(m):
            got = per(m)
            rs = [got[r]["commits_per_s"] / allow[r]["commits_per_s"] for r in got if r in allow]
            return f"{st.median(rs):.2f}x" if rs else "refused"
        def med(m, f):
            v = [x[f] for x in per(m).values()]
            return f"{st.median(v):.{0 if 'kib' in f else 2}f}" if v else "-"
        dw, sw = per("doublewrite"), per("second-write")
        for r in dw:
            if r in sw:
                cells += 1
                wins += dw[r]["commits_per_s"] > sw[r]["commits_per_s"]
        print(f"| {lab} | {k[0]} | {k[1]} | {st.median(x['commits_per_s'] for x in allow.values()):.0f} "
              f"| {ratio('atomic')} | {ratio('doublewrite')} | {ratio('second-write')} "
              f"| {med('allow', 'write_kib_per_commit')} / {med('doublewrite', 'write_kib_per_commit')} / {med('second-write', 'write_kib_per_commit')} "
              f"| {med('allow', 'syncs_per_commit')} / {med('doublewrite', 'syncs_per_commit')} |")
print(f"\ndoublewrite beat the second write in {wins} of {cells} round-cells ({rounds} rounds)")
PY
