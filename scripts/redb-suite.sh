#!/usr/bin/env bash
# redb's own test suite on pagewriter: unpacks the redb crate this
# workspace locks (its published source, with its tests), swaps redb's
# `FileBackend` for one that stores every database through the
# pagewriter-redb adapter (scripts/redb-suite/file_backend.rs), builds the
# test binaries, runs each with a timeout and prints per configuration
# pass / fail / ignored / hung, and each failure with its cause. redb's
# doctests run too.
#
# Usage: scripts/redb-suite.sh [--configs direct,buffered,grow-ahead] [--timeout SECS]
#                              [--work DIR] [--baseline] [--filter SUBSTR]
#   direct:   the adapter's defaults (O_DIRECT where the file system takes
#             it, io_uring where a ring can be set up)
#   buffered: the same through the page cache (PW_REDB_SUITE_DIRECT=off)
#   grow-ahead: buffered with a 1 MiB grow-ahead window
#             (PW_REDB_SUITE_GROW_AHEAD; redb grows its file by set_len)
#   cf:       each database in a column family of one shared file per
#             test process, another family of it written and committed
#             meanwhile (PW_REDB_SUITE_CF)
#   --baseline also runs the unmodified copy (redb's own FileBackend)
#   --timeout per test binary (default 600 s); its unfinished tests: hung
#   --work    where the copies and their builds go (default: a fresh
#             directory under ${TMPDIR:-/tmp}, removed at exit; given, kept)
#   The last line per configuration is machine-readable:
#   RESULT <config> pass=N fail=N ignored=N hung=N total=N
#   (cf adds unexpected=N, failures outside the expected list, and
#   flaky=N, such failures that passed when run again alone)
set -euo pipefail
usage() { sed -n '2,25p' "$0" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
configs=direct,buffered timeout=600 work= baseline=0 filter=
while [ $# -gt 0 ]; do
  case $1 in
    --configs) configs=${2:?}; shift ;;
    --timeout) timeout=${2:?}; shift ;;
    --work) work=${2:?}; shift ;;
    --baseline) baseline=1 ;;
    --filter) filter=${2:?}; shift ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
  shift
done
[[ $timeout =~ ^[0-9]+$ && $timeout -gt 0 ]] || { echo "--timeout: a whole number of seconds > 0, got $timeout" >&2; exit 2; }
for c in ${configs//,/ }; do
  case $c in direct|buffered|grow-ahead|cf) ;; *) echo "--configs: direct, buffered, grow-ahead and/or cf, got $c" >&2; exit 2 ;; esac
done
if [ -z "$work" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/redb-suite.XXXXXX")
  trap 'rm -rf "$work"' EXIT
else
  mkdir -p "$work"
fi
case $(cd "$work" && pwd)/ in "$repo"/*) echo "--work must be outside the repository (cargo would take the copy for a workspace member)" >&2; exit 2 ;; esac

# The redb version the adapter builds against, and its published source.
(cd "$repo" && cargo fetch --locked -q)
ver=$(cd "$repo" && cargo metadata --format-version 1 --locked | python3 -c '
import json, sys
pkgs = json.load(sys.stdin)["packages"]
print(next(p["version"] for p in pkgs if p["name"] == "redb" and p["source"]))')
crate=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"redb-$ver.crate" | head -n1)
[ -f "$crate" ] || { echo "redb-$ver.crate not in the cargo cache after cargo fetch" >&2; exit 1; }
echo "redb $ver from $crate"

unpack() { # dir
  rm -rf "$1"; mkdir -p "$1"
  tar -xzf "$crate" -C "$1" --strip-components=1
  # Its pinned toolchain may not be installed here; any 1.90+ builds it.
  rm -f "$1/rust-toolchain" "$1/rust-toolchain.toml"
  printf '\n[workspace]\n' >> "$1/Cargo.toml"
}
unpack "$work/upstream"
unpack "$work/pagewriter"
python3 - "$work/pagewriter" "$repo" <<'PY'
import pathlib, re, sys
root, repo = pathlib.Path(sys.argv[1]), sys.argv[2]
fb = root / "src/tree_store/page_store/file_backend"
# redb's own backend stays (its unit tests test it), under another name.
opt = fb / "optimized.rs"
opt.write_text("#![allow(dead_code)]\n" + re.sub(r"\bFileBackend\b", "OsFileBackend", opt.read_text()))
mod = fb / "mod.rs"
text = mod.read_text()
old = "#[cfg(any(windows, unix, target_os = \"wasi\"))]\npub use optimized::FileBackend;"
assert old in text, "redb's file_backend/mod.rs changed: update scripts/redb-suite.sh"
text = text.replace(old, "mod pw;\npub use pw::FileBackend;")
old = "#[cfg(any(windows, unix, target_os = \"wasi\"))]\nmod optimized;"
assert old in text, "redb's file_backend/mod.rs changed: update scripts/redb-suite.sh"
mod.write_text(text.replace(old, "pub(crate) mod optimized;"))
(fb / "pw.rs").write_text((pathlib.Path(repo) / "scripts/redb-suite/file_backend.rs").read_text())
# The adapter, inside redb (it cannot depend on pagewriter-redb, which
# depends on redb): its doc comments dropped (they would run as redb's
# doctests), `redb::` paths made crate paths, and the redb backend it
# takes its locks through is redb's own (renamed above), not the swap.
src = (pathlib.Path(repo) / "redb/src/lib.rs").read_text()
lines = [l for l in src.splitlines() if not l.lstrip().startswith(("//!", "///"))]
adapter = "\n".join(lines).replace(
    "redb::backends::FileBackend",
    "crate::tree_store::page_store::file_backend::optimized::OsFileBackend",
).replace("redb::", "crate::")
(root / "src/pw_backend.rs").write_text("#![allow(dead_code)]\n" + adapter + "\n")
# Its column families, the module `pw_backend::cf`.
src = (pathlib.Path(repo) / "redb/src/cf.rs").read_text()
lines = [l for l in src.splitlines() if not l.lstrip().startswith(("//!", "///"))]
cf = "\n".join(lines).replace("use crate::PagewriterBackend;", "use super::PagewriterBackend;")
(root / "src/pw_backend").mkdir(exist_ok=True)
(root / "src/pw_backend/cf.rs").write_text("#![allow(dead_code)]\n" + cf.replace("redb::", "crate::") + "\n")
lib = root / "src/lib.rs"
lib.write_text(lib.read_text() + "\nmod pw_backend;\n")
cargo = root / "Cargo.toml"
cargo.write_text(cargo.read_text() + f'''
[dependencies.pagewriter]
path = "{repo}"
default-features = false
features = ["io-uring"]

[dependencies.crc32c]
version = "0.6.9"
''')
PY

# Builds a copy's test binaries; prints their paths.
build() { # dir
  (cd "$1" && cargo test --tests --no-run --message-format=json 2>"$1/build.log") |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])' || { tail -30 "$1/build.log" >&2; return 1; }
}

# Runs every binary; prints each failure with its cause and the totals.
run() { # label dir [env...]
  local label=$1 dir=$2; shift 2
  local bins out
  bins=$(build "$dir") || { echo "build of $dir failed" >&2; exit 1; }
  out="$dir/results.$label"; rm -rf "$out"; mkdir -p "$out"
  for b in $bins; do
    local name; name=$(basename "$b")
    printf '%s\t%s\n' "$name" "$b" >> "$out/bins.tsv"
    (cd "$dir" && env "$@" "$b" --list --format terse 2>/dev/null) | sed -n 's/: test$//p' > "$out/$name.list"
    set +e
    (cd "$dir" && env "$@" timeout --kill-after=10 "$timeout" "$b" ${filter:+"$filter"} > "$out/$name.log" 2>&1)
    echo $? > "$out/$name.rc"
    set -e
  done
  # redb's doctests (they open databases too).
  (cd "$dir" && env "$@" cargo test --doc -- --list 2>/dev/null) | sed -n 's/: test$//p' > "$out/doctests.list"
  set +e
  (cd "$dir" && env "$@" timeout --kill-after=10 "$timeout" cargo test --doc -- ${filter:+"$filter"} > "$out/doctests.log" 2>&1)
  echo $? > "$out/doctests.rc"
  set -e
  python3 - "$label" "$out" "$timeout" "$filter" "$repo/scripts/redb-suite/cf-expected-failures.txt" "$dir" "$@" <<'PY'
import os, pathlib, re, subprocess, sys
label, out, timeout, filt = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4]
cwd, extra_env = sys.argv[6], dict(kv.split("=", 1) for kv in sys.argv[7:])
# Under `cf` the tests that handle the file itself (its size, its bytes,
# a copy of it, its locks) cannot pass: they are listed, with why.
expected = set()
if label == "cf":
    for line in pathlib.Path(sys.argv[5]).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            expected.add(line)
total = dict(ok=0, failed=0, ignored=0, hung=0)
causes = []
for lst in sorted(out.glob("*.list")):
    name = lst.name[:-5]
    tests = [t for t in lst.read_text().split("\n") if t and (not filt or filt in t)]
    log = (out / f"{name}.log").read_text(errors="replace")
    rc = int((out / f"{name}.rc").read_text())
    seen = {}
    for m in re.finditer(r"^test (.+?)(?: - compile fail| - should panic)* \.\.\. (ok|FAILED|ignored)", log, re.M):
        seen[m.group(1)] = m.group(2)
    for t in tests:
        r = seen.get(t)
        if r == "ok":
            total["ok"] += 1
        elif r == "ignored":
            total["ignored"] += 1
        elif r == "FAILED":
            total["failed"] += 1
            sec = re.search(r"^---- " + re.escape(t) + r" stdout ----\n(.*?)(?=^---- |^failures:|\Z)", log, re.M | re.S)
            why = "no output"
            if sec:
                body = sec.group(1)
                p = re.search(r"panicked at [^\n]*\n([^\n]*)", body)
                why = (p.group(1) if p else body.strip().split("\n")[0])[:160]
            causes.append((name.rsplit("-", 1)[0], t, why))
        else:
            total["hung"] += 1
            causes.append((name.rsplit("-", 1)[0], t, f"no result: the binary exited {rc}" + (f" (timeout {timeout} s)" if rc in (124, 137) else "")))
# Under cf a failure outside the list runs twice more on its own: one
# that passes then does not fail the run but is printed as FLAKY, named,
# and counted (flaky=N): a lead to chase, not a pass.
bins = dict(l.split("\t", 1) for l in (out / "bins.tsv").read_text().splitlines() if l)
def passes_alone(binary, t):
    path = next((p for n, p in bins.items() if n.rsplit("-", 1)[0] == binary), None)
    if path is None:
        return False
    try:
        r = subprocess.run([path, "--exact", t], cwd=cwd, env={**os.environ, **extra_env},
                           capture_output=True, timeout=int(timeout))
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0 and b"1 passed" in r.stdout
unexpected = flaky = 0
for binary, t, why in causes:
    listed = f"{binary}::{t}" in expected
    note = " (expected under cf)" if listed else ""
    if label == "cf" and not listed and binary != "doctests":
        tries = [passes_alone(binary, t) for _ in range(2)]
        if any(tries):
            flaky += 1
            note = f" (FLAKY under cf: failed in the run, then {'passed' if tries[0] else 'failed'}, {'passed' if tries[1] else 'failed'} alone)"
            listed = True
    unexpected += not listed
    print(f"  {label}: {binary}::{t}: {why}{note}")
n = sum(total.values())
extra = f" unexpected={unexpected} flaky={flaky}" if label == "cf" else ""
print(f"RESULT {label} pass={total['ok']} fail={total['failed']} ignored={total['ignored']} hung={total['hung']} total={n}{extra}")
PY
}

if [ "$baseline" = 1 ]; then
  echo "== upstream (redb's own FileBackend)"
  run upstream "$work/upstream"
fi
for c in ${configs//,/ }; do
  echo "== pagewriter, $c"
  if [ "$c" = buffered ]; then
    run "$c" "$work/pagewriter" PW_REDB_SUITE_DIRECT=off
  elif [ "$c" = cf ]; then
    rm -rf "$work/cf"; mkdir -p "$work/cf"
    run "$c" "$work/pagewriter" PW_REDB_SUITE_DIRECT=on PW_REDB_SUITE_CF="$work/cf"
    rm -rf "$work/cf"
  elif [ "$c" = grow-ahead ]; then
    run "$c" "$work/pagewriter" PW_REDB_SUITE_DIRECT=off PW_REDB_SUITE_GROW_AHEAD=$((1 << 20))
  else
    run "$c" "$work/pagewriter" PW_REDB_SUITE_DIRECT=on
  fi
done
