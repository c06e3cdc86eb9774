#!/usr/bin/env bash
# Starts 4 order_lines processes over loopback TLS, submits lines at every replica (generated at
# 0 and 2, from stdin at 1 and 3) and checks that all four print the same delivered sequence.
# Usage: crates/bft/examples/order_lines_check.sh [path/to/order_lines]
set -euo pipefail
bin="${1:-}"
if [[ -z "$bin" ]]; then
  cargo build -q -p bft --features transport --example order_lines
  bin="${CARGO_TARGET_DIR:-target}/debug/examples/order_lines"
fi
dir="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT

"$bin" --gen-certs "$dir/pki"
base=$(( 20000 + RANDOM % 20000 ))
peers="127.0.0.1:$base,127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2)),127.0.0.1:$((base + 3))"
per=50
total=$(( 4 * per ))
for id in 0 1 2 3; do
  if (( id % 2 == 0 )); then
    "$bin" --id "$id" --certs "$dir/pki" --peers "$peers" --generate "$per" --expect "$total" \
      >"$dir/out-$id" 2>"$dir/err-$id" </dev/null &
  else
    seq 1 "$per" | sed "s/^/stdin line $id./" | \
      "$bin" --id "$id" --certs "$dir/pki" --peers "$peers" --expect "$total" \
      >"$dir/out-$id" 2>"$dir/err-$id" &
  fi
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do
  if ! timeout 60 tail --pid="$p" -f /dev/null; then status=1; fi
  wait "$p" || status=1
done
if (( status != 0 )); then
  echo "FAIL: a replica did not finish cleanly"; tail -n 5 "$dir"/err-*; exit 1
fi
for id in 0 1 2 3; do
  lines=$(wc -l <"$dir/out-$id")
  if (( lines != total )); then echo "FAIL: replica $id printed $lines lines, expected $total"; exit 1; fi
  # Requests from every origin must be there, each exactly once.
  if (( $(cut -d' ' -f3 "$dir/out-$id" | sort -u | wc -l) != total )); then
    echo "FAIL: replica $id delivered a request twice"; exit 1
  fi
done
for id in 1 2 3; do
  if ! cmp -s "$dir/out-0" "$dir/out-$id"; then
    echo "FAIL: replica $id delivered a different sequence than replica 0"
    diff "$dir/out-0" "$dir/out-$id" | head; exit 1
  fi
done
echo "OK: 4 processes delivered the same $total requests in the same order (last seq $(tail -n1 "$dir/out-0" | cut -d" " -f1))"
head -n 3 "$dir/out-0"
