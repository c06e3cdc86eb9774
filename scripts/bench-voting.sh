#!/usr/bin/env bash
# Voting reads beside ordered and unordered single-server reads, with dnsperf, in one run on
# one 4-replica cluster (ordered reads, opt-te, 1024-bit key):
#
#   named      dnsperf straight at replica 0's named (the baseline: no sdns at all)
#   local      dnsperf at replica 0 with the voting-read EDNS option: one replica answers from
#              its named without ordering (the same path as `--reads local`)
#   ordered    dnsperf at replica 0, plain queries: one replica, every read ordered by PBFT
#   vote       dnsperf at `sdns stub`: every query voted over all 4 replicas (voting read,
#              2t+1 matching answers; ordered fallback never needed here)
#   vote-ord   dnsperf at `sdns stub --ordered`: every query an ordered read at all 4 replicas
#
# Each target twice: latency at one outstanding query, and throughput at 64 outstanding.
# Usage: scripts/bench-voting.sh [SECONDS]   (needs a built sdns and SDNS_BIND_DIR or target/bind9)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
SECONDS_EACH=${1:-10}
SDNS=${SDNS_BIN:-$ROOT/target/debug/sdns}
BIND=${SDNS_BIND_DIR:-$ROOT/target/bind9}
WORK=$(mktemp -d /tmp/sdns-bench-voting-XXXXXX)
# Ports BASE+1.. (clients), +51/+52 (stubs), +101.. (peers), +201.. (named), +301.. (metrics).
BASE=${BENCH_BASE:-$((20000 + ($$ % 100) * 400))}
STUBS=()

cleanup() {
  for pid in "${STUBS[@]}"; do kill "$pid" 2>/dev/null || true; done
  "$SDNS" cluster down --replicas 4 --dir "$WORK/cluster" >/dev/null 2>&1 || true
}
trap cleanup EXIT

"$SDNS" cluster up --bits 1024 --replicas 4 --dir "$WORK/cluster" --bind-dir "$BIND" \
  --client-port $((BASE + 1)) --peer-port $((BASE + 101)) --named-port $((BASE + 201)) \
  --metrics-port $((BASE + 301)) > "$WORK/up.log" 2>&1
R=127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2)),127.0.0.1:$((BASE + 3)),127.0.0.1:$((BASE + 4))
"$SDNS" stub --listen 127.0.0.1:$((BASE + 51)) --replicas "$R" 2>"$WORK/stub.log" & STUBS+=($!)
"$SDNS" stub --ordered --listen 127.0.0.1:$((BASE + 52)) --replicas "$R" 2>"$WORK/stub-ordered.log" & STUBS+=($!)
for name in www mail ns0 ns1 ns2 ns3; do echo "$name.example.test A"; done > "$WORK/queries.txt"
echo "example.test MX" >> "$WORK/queries.txt"
sleep 1
# Warm up and check every target answers.
for port in $((BASE + 201)) $((BASE + 1)) $((BASE + 51)) $((BASE + 52)); do
  dig @127.0.0.1 -p "$port" +norec +short +time=5 www.example.test A | grep -q 192.0.2.80
done

VOTE_OPT=65042:$(printf 'sdns-vote/1' | od -An -tx1 | tr -d ' \n')
run() {  # run TAG PORT OUTSTANDING [dnsperf args...]
  local tag=$1 port=$2 q=$3; shift 3
  local out
  out=$(dnsperf -s 127.0.0.1 -p "$port" -d "$WORK/queries.txt" -l "$SECONDS_EACH" -c 1 -q "$q" -t 5 "$@" 2>&1)
  local qps lat lost
  qps=$(echo "$out" | awk '/Queries per second/ {print $4}')
  lat=$(echo "$out" | awk '/Average Latency/ {print $4}')
  lost=$(echo "$out" | awk '/Queries lost/ {print $3}')
  printf '%-9s q=%-3s  %10s queries/s  avg latency %10s s  lost %s\n' "$tag" "$q" "$qps" "$lat" "$lost"
}
echo "# $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $SECONDS_EACH s each; sdns $($SDNS --version)"
for q in 1 64; do
  run named "$((BASE + 201))" "$q"
  run local "$((BASE + 1))" "$q" -E "$VOTE_OPT"
  run ordered "$((BASE + 1))" "$q"
  run vote "$((BASE + 51))" "$q"
  run vote-ord "$((BASE + 52))" "$q"
done
