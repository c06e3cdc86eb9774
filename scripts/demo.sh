#!/usr/bin/env bash
# The main job (README.md): builds everything and starts a 4-replica cluster on this
# machine serving the demo zone example.test, then prints the dig, delv and nsupdate
# lines to try. Run it again to reuse the same keys; `scripts/demo.sh down` stops it.
set -euo pipefail
cd "$(dirname "$0")/.."

REPLICAS=${REPLICAS:-4}
DIR=${SDNS_DIR:-.cluster}

if [ "${1:-up}" = "down" ]; then
  exec target/debug/sdns cluster down --replicas "$REPLICAS" --dir "$DIR"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "demo: cargo not found; install Rust (https://rustup.rs), then run this again" >&2
  exit 1
fi

scripts/install-deps.sh
patches/bind9/build.sh
cargo build --workspace --bins
target/debug/sdns cluster up --replicas "$REPLICAS" --dir "$DIR" --bind-dir target/bind9
