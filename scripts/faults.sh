#!/usr/bin/env bash
# Runs the fault-injection scenarios (tests/faults.rs) against real clusters, the long
# ignored ones included, one at a time, and prints each scenario's figures (the lines
# starting with "FAULTS") for docs/RELIABILITY.md.
#
#   scripts/faults.sh                 # every scenario that can pass on this branch
#   scripts/faults.sh kill9_primary   # the scenarios whose name contains the word
#
# State transfer: scripts/statexfer-bench.sh. `full_cluster_restart` is ignored with its reason
# and not run here; `cargo test --test faults -- --ignored full_cluster_restart` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

export SDNS_BIND_DIR="${SDNS_BIND_DIR:-$PWD/target/bind9}"
cargo build --bins -p sdns
log="$(mktemp -t sdns-faults.XXXXXX)"
scenarios=(
  sigstopped_replica_catches_up_at_the_live_rate
  sigstop_for_a_minute
  sigstop_for_a_minute_under_read_load
  kill9_backup_mid_stream
  kill9_primary_mid_stream
  kill9_named_mid_stream
  kill9_at_random_moments
  retransmitted_updates_execute_once
  more_than_t_down_then_back
  skewed_clock_replica
  restored_from_an_old_copy
  state_directory_deleted
)
status=0
echo "faults: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, log $log"
for s in "${scenarios[@]}"; do
  if [ $# -gt 0 ] && [[ "$s" != *"$1"* ]]; then continue; fi
  from=$(($(wc -l <"$log") + 1))
  if cargo test --test faults -- --include-ignored --exact "$s" --nocapture >>"$log" 2>&1; then
    echo "PASS $s"
  else
    echo "FAIL $s (see $log)"
    status=1
  fi
  tail -n "+$from" "$log" | grep "^FAULTS " || true
done
exit $status
