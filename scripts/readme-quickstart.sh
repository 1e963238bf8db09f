#!/usr/bin/env bash
# The README's quick start as a reader runs it: a new project made with
# `cargo new`, the dependency added with the README's `cargo add` line
# (a path to this checkout), the README's program pasted as src/main.rs
# unchanged, then `cargo run`. Fails if any step does, or if the program
# does not print its last line.
#
# Usage: scripts/readme-quickstart.sh [WORK_DIR]   (default: a temporary directory, removed)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -ge 1 ]; then
  work=$1; mkdir -p "$work"; keep=1
else
  work=$(mktemp -d); keep=0
fi
cleanup() { [ "$keep" = 1 ] || rm -rf "$work"; }
trap cleanup EXIT
# The program: the first rust block after the line that introduces it.
program=$(awk '/^The whole of `my-engine\/src\/main.rs`/ { found = 1 }
               found && /^```rust$/ { inside = 1; next }
               inside && /^```$/ { exit }
               inside { print }' "$repo/README.md")
if [ -z "$program" ]; then
  echo "readme-quickstart: no program found in README.md" >&2
  exit 1
fi
cd "$work"
cargo new --quiet --vcs none my-engine
cd my-engine
cargo add --quiet pagewriter --path "$repo"
printf '%s\n' "$program" > src/main.rs
out=$(CARGO_TARGET_DIR="$work/target" cargo run --quiet)
echo "$out"
grep -q '^8 pages committed, read back, file removed$' <<<"$out" || {
  echo "readme-quickstart: the program did not finish" >&2
  exit 1
}
