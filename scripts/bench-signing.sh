#!/usr/bin/env bash
# Whole-zone signing at scale (issue 13): CPU per replica against dnssec-signzone on the same
# zone, read gaps and update acknowledgements while `sdns sign-zone` runs in the background.
# Usage: scripts/bench-signing.sh [NAMES ...]   (default: 1000 10000); see scripts/bench/signing.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export SDNS_BIN="${SDNS_BIN:-$PWD/target/debug/sdns}"
export SDNS_BIND_DIR="${SDNS_BIND_DIR:-$PWD/target/bind9}"
[ -x "$SDNS_BIN" ] || cargo build -p sdns --bin sdns
exec python3 scripts/bench/signing.py "$@"
