#!/usr/bin/env bash
# Convergence by state transfer against the zone's size (issue 9's bar): for each size, a
# 4-replica cluster whose zone has that many extra names; replica 3 is down while the others
# order 5,000 batches, then started again; then replica 2 loses its state directory and is
# started again. Prints the FAULTS lines recorded in docs/RELIABILITY.md ("State transfer").
#
#   scripts/statexfer-bench.sh              # 1000 and 10000 names
#   SDNS_XFER_SIZES="1000" scripts/statexfer-bench.sh
#   SDNS_XFER_BATCHES=2000 scripts/statexfer-bench.sh   # a shorter absence
set -euo pipefail
cd "$(dirname "$0")/.."

export SDNS_BIND_DIR="${SDNS_BIND_DIR:-$PWD/target/bind9}"
cargo build --bins -p sdns
log="$(mktemp -t sdns-statexfer.XXXXXX)"
echo "statexfer-bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), log $log"
status=0
for names in ${SDNS_XFER_SIZES:-1000 10000}; do
  from=$(($(wc -l <"$log") + 1))
  if SDNS_XFER_NAMES=$names cargo test --test statexfer -- --include-ignored --exact convergence_time_by_zone_size --nocapture >>"$log" 2>&1; then
    echo "PASS $names names"
  else
    echo "FAIL $names names (see $log)"
    status=1
  fi
  tail -n "+$from" "$log" | grep -E "^FAULTS |^cluster up with" || true
done
exit $status
