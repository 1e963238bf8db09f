#!/usr/bin/env bash
# The core and the redb adapter on the platforms besides Linux:
#
#   1. clippy (warnings denied, every target of both crates) for macOS,
#      FreeBSD and Windows;
#   2. the core's tests built for Windows (x86_64-pc-windows-gnu, MinGW)
#      and run under Wine, the shuttle model check included; the totals
#      must show no failure and at least MIN_PASSED passes.
#
# macOS and FreeBSD builds are checked, not run: no emulator for them
# here. Needs rustup (the targets), and for step 2 gcc-mingw-w64 and Wine,
# installed with apt-get where missing (as root); without them step 2 is
# reported as not run and the script fails when --require-wine is given.
#
# Usage: scripts/cross-platform.sh [--require-wine] [--skip-clippy]
set -euo pipefail
cd "$(dirname "$0")/.."

# The core's tests under Wine that must pass: 142 when this was written
# (124 plus the 18 shuttle tests); a drop below means tests went missing.
MIN_PASSED=140
require_wine=0
clippy=1
for a in "$@"; do
  case "$a" in
    --require-wine) require_wine=1 ;;
    --skip-clippy) clippy=0 ;;
    *) echo "usage: $0 [--require-wine] [--skip-clippy]" >&2; exit 2 ;;
  esac
done

targets=(x86_64-apple-darwin x86_64-unknown-freebsd x86_64-pc-windows-gnu)
if command -v rustup >/dev/null 2>&1; then
  installed=$(rustup target list --installed)
  for t in "${targets[@]}"; do
    grep -qx "$t" <<<"$installed" || rustup target add "$t"
  done
else
  echo "cross-platform: no rustup, so no other targets: nothing checked" >&2
  exit 1
fi

if [ "$clippy" = 1 ]; then
  for t in "${targets[@]}"; do
    echo "== clippy --target $t"
    cargo clippy -p pagewriter -p pagewriter-redb --all-targets --target "$t" --locked \
      -- -D warnings -D clippy::undocumented_unsafe_blocks
  done
fi

echo "== the core's tests for Windows, under Wine"
if ! command -v x86_64-w64-mingw32-gcc >/dev/null 2>&1 || ! command -v wine >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      gcc-mingw-w64-x86-64 wine wine64 >/dev/null) || echo "cross-platform: apt could not install MinGW and Wine"
  fi
fi
if ! command -v x86_64-w64-mingw32-gcc >/dev/null 2>&1 || ! command -v wine >/dev/null 2>&1; then
  echo "cross-platform: no MinGW gcc or Wine here: the Windows tests did not run"
  [ "$require_wine" = 1 ] && exit 1
  exit 0
fi

# A Wine prefix of our own, with the bcryptprimitives.dll shim Wine 8
# lacks (.ci/wine/bcryptprimitives.c says why).
export WINEPREFIX="$PWD/target/wine-prefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
mkdir -p "$WINEPREFIX"
[ -d "$WINEPREFIX/drive_c/windows/system32" ] || wineboot -i >/dev/null 2>&1 || true
x86_64-w64-mingw32-gcc -shared -O2 -o "$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll" \
  .ci/wine/bcryptprimitives.c .ci/wine/bcryptprimitives.def -ladvapi32
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=wine

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test -p pagewriter --target x86_64-pc-windows-gnu --locked --no-fail-fast 2>&1 | tee "$log" \
  | grep -E '^(test result|     Running|test .*(FAILED|ignored, ))' || status=$?
cargo test -p pagewriter --target x86_64-pc-windows-gnu --locked --features shuttle \
  --test shuttle_commit 2>&1 | tee -a "$log" | grep -E '^(test result|test .*FAILED)' || status=$?

# A test binary that died under Wine before its summary line, with no
# test failed, is run once more (one has ended so in CI, leaving no
# output to tell why, and passed in every run since). What the first run
# printed goes to the log, and the binary counts only if the second run
# passes; a test that fails is never run again.
died=$(awk '/^     Running / { if (name != "" && !done) print name; name = $2; done = 0 }
            /^test result/ { done = 1 }
            END { if (name != "" && !done) print name }' "$log")
if [ "$status" != 0 ] && [ -n "$died" ] && ! grep -qE '^test result: FAILED|^test .* FAILED$' "$log"; then
  status=0
  while read -r name; do
    case "$name" in
      unittests) select=(--lib) ;;
      tests/shuttle_commit.rs) select=(--features shuttle --test shuttle_commit) ;;
      tests/*.rs) select=(--test "$(basename "$name" .rs)") ;;
      *) echo "cross-platform: no way to rerun $name" >&2; status=1; continue ;;
    esac
    echo "== $name died under Wine before its summary; what it printed:" >&2
    awk -v n="$name" '/^     Running / { on = ($2 == n) } on' "$log" >&2
    echo "== $name once more" >&2
    cargo test -p pagewriter --target x86_64-pc-windows-gnu --locked "${select[@]}" </dev/null 2>&1 \
      | tee -a "$log" | grep -E '^(test result|     Running|test .*FAILED)' || status=$?
  done <<<"$died"
fi
read -r passed failed ignored < <(awk '/^test result/ { p += $4; f += $6; i += $8 }
  END { print p + 0, f + 0, i + 0 }' "$log")
echo "windows (wine): $passed passed, $failed failed, $ignored ignored"
# The filter above shows summaries only. For a binary that failed, or
# died before its summary, print everything it and cargo printed, so the
# log names the cause.
if [ "$status" != 0 ] || [ "$failed" != 0 ]; then
  echo "== what the failing Windows test binaries printed" >&2
  awk '/^     Running / { if (sec != "" && !ok) printf "%s", sec; sec = ""; ok = 0; on = 1 }
       /^test result: ok/ { ok = 1 }
       on { sec = sec $0 "\n" }
       END { if (sec != "" && !ok) printf "%s", sec }' "$log" | tail -n 300 >&2
  echo "== the last lines cargo printed" >&2
  tail -n 30 "$log" >&2
fi
if [ "$status" != 0 ] || [ "$failed" != 0 ] || [ "$passed" -lt "$MIN_PASSED" ]; then
  echo "cross-platform: the Windows tests failed, or fewer than $MIN_PASSED passed" >&2
  exit 1
fi
