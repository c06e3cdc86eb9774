#!/usr/bin/env bash
# Writes (issue 27): TSIG update clients against a 4-replica cluster (`sdns cluster up
# --algorithm A`) and, in the same run, against one stock named signing the same zone with its
# own key under a dnssec-policy of the same algorithm; same TSIG key, same clients.
# Usage: scripts/bench-writes.sh   (environment: SDNS_BENCH_ALGORITHMS ["13 8"],
# SDNS_BENCH_CLIENTS [8], SDNS_BENCH_SECONDS [15], SDNS_BENCH_ROUNDS [1],
# SDNS_BENCH_BASE_PORT [23000], BENCH_NAMED [/usr/sbin/named]); see scripts/bench/writes.py.
# Figures: docs/BENCHMARKS.md, "Writes and whole-zone signing with algorithm 13".
set -euo pipefail
cd "$(dirname "$0")/.."
export SDNS_BIN="${SDNS_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/sdns}"
export SDNS_BIND_DIR="${SDNS_BIND_DIR:-$PWD/target/bind9}"
[ -x "$SDNS_BIN" ] || cargo build --release -p sdns --bin sdns
[ -x "${BENCH_NAMED:-/usr/sbin/named}" ] || { echo "bench-writes: no stock named (scripts/install-deps.sh installs Debian's bind9)" >&2; exit 1; }
exec python3 scripts/bench/writes.py "$@"
