#!/usr/bin/env bash
# The project's test command (README.md): installs what it needs, builds the
# patched named, then runs every test in the workspace, the system tests in
# tests/ included.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
if [ -x patches/bind9/build.sh ]; then
  patches/bind9/build.sh
fi
# The system tests start the sdns binary; build it first so they find it.
cargo build --workspace --bins
cargo test --workspace --no-fail-fast
