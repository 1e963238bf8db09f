#!/usr/bin/env bash
# `pagewriter cf` with RocksDB among the peers: builds the CLI with the
# `peers` and `peer-rocksdb` features (RocksDB's C++ library: about 20
# minutes on 2 cores the first time; needs a C++ compiler and libclang,
# e.g. `apt-get install -y g++ libclang-dev`) into its own target
# directory, then runs `cf` with every engine and the arguments given.
#
# Usage: scripts/cf-rocksdb.sh [cf args...]
#   e.g. scripts/cf-rocksdb.sh --writers 1,8 --path /some/dir --plot cf.svg
# Environment: CF_ROCKSDB_TARGET (default target/rocksdb) for the build.
set -euo pipefail
case ${1:-} in -h|--help) sed -n '2,10p' "$0"; exit 0 ;; esac
repo=$(cd "$(dirname "$0")/.." && pwd)
target=${CF_ROCKSDB_TARGET:-$repo/target/rocksdb}
(cd "$repo" && CARGO_TARGET_DIR=$target cargo build --release --locked -p pagewriter-bench \
  --features peers,peer-rocksdb)
exec "$target/release/pagewriter" cf "$@"
