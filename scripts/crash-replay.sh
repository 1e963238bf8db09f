#!/usr/bin/env bash
# The long crash replay (docs/testing.md "Crash replay below the file
# system"): every workload on ext4, XFS and btrfs made on a logged loop
# device, STATES replayed crash states per workload (flush points first,
# then states with the writes after a flush torn). Needs root, /dev/fuse,
# loop devices and the three mkfs/fsck tools. CI runs a bounded version
# (`CRASHLOG_STATES=40 cargo test -p pagewriter-crashlog`).
#
# Usage: scripts/crash-replay.sh [STATES] [SEED] [-- more pagewriter-crashlog args]
#   e.g. scripts/crash-replay.sh 130 7    (11 workloads x 130 = 1430 per file system)
set -euo pipefail
states=${1:-130} seed=${2:-1}
[ $# -gt 0 ] && shift; [ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
case $states$seed in *[!0-9]*) echo "STATES and SEED are whole numbers" >&2; exit 2 ;; esac
cargo build --release --locked -q -p pagewriter-crashlog
work=$(mktemp -d "${TMPDIR:-/tmp}/crash-replay.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "crash replay: $states states per workload, seed $seed, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%F)"
target/release/pagewriter-crashlog --states "$states" --seed "$seed" --work "$work" "$@"
