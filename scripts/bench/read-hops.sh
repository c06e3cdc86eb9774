#!/usr/bin/env bash
# Per-read cost of ordered (vouched) reads, replica by replica (docs/BENCHMARKS.md, "Reads",
# 2026-11-25): a 4-replica cluster with reads = "ordered", then
#   1. 1,000 sequential UDP probes (scripts/bench/measure.py probe) after the same 1,000 as
#      warm-up, so every read is a read-cache hit at every replica: the unloaded percentiles,
#      and each `sdns run` process's context switches (all threads, /proc) and CPU
#      (utime+stime, 10 ms ticks) per read;
#      before them the same 1,000 asked of replica 0's own named (the baseline in the same run);
#   2. dnsperf -c 4 -q 10 -l 5 -D on the same query file: q/s and the same per-read figures.
# Usage: scripts/bench/read-hops.sh LABEL SDNS_BINARY [PORT_BASE]
# Environment: KEYS [target/bench-keys/n4-1024] (dealt by scripts/bench-cluster.sh with
# BENCH_BITS=1024), SDNS_BIND_DIR [target/bind9], NAMES (add the bench's zone of that many
# hosts and probe its query mix; unset: the demo zone, www.example.test A), WARM [1000],
# PRELOAD (seconds of dnsperf -q 200 before the warm-up, as the bench's probe follows its load).
set -u
label=$1 bin=$2 base=${3:-38000}
root=$(cd "$(dirname "$0")/../.." && pwd)
keys=${KEYS:-$root/target/bench-keys/n4-1024}
bind=${SDNS_BIND_DIR:-$root/target/bind9}
measure=$root/scripts/bench/measure.py
dir=$(mktemp -d /tmp/sdns-hops.XXXXXX)
trap '"$bin" cluster down --replicas 4 --dir "$dir" > /dev/null 2>&1; rm -rf "$dir"' EXIT
cp -a "$keys/." "$dir/"
if [ -n "${NAMES:-}" ]; then
  for i in 0 1 2 3; do python3 "$measure" bigzone example.test "$NAMES" >> "$dir/replica-$i/zone.db"; done
  python3 "$measure" mixfile example.test "$NAMES" > "$dir/q.txt"
else
  yes "www.example.test A" | head -1000 > "$dir/q.txt"
fi
"$bin" cluster up --replicas 4 --dir "$dir" --bits 1024 --zone example.test --bind-dir "$bind" \
  --protocol opt-te --client-port "$base" --peer-port $((base + 10)) --named-port $((base + 20)) \
  --metrics-port $((base + 30)) --reads ordered > "$dir/up.log" 2>&1 || { echo "cluster up failed"; tail "$dir/up.log"; exit 1; }
sleep 3
# The replicas' processes, in replica order.
pids=$(for p in $(pgrep -f " run .*$dir"); do
  echo "$(tr '\0' ' ' < /proc/$p/cmdline | grep -o 'replica-[0-9]*' | head -1) $p"
done | sort | awk '{print $2}')
snap() { for p in $pids; do
  echo "$p $(cat /proc/$p/task/*/status 2>/dev/null | awk '/ctxt_switches/ {s += $2} END {print s}') $(awk '{print $14 + $15}' /proc/$p/stat)"
done; }
if [ -n "${PRELOAD:-}" ]; then
  dnsperf -s 127.0.0.1 -p "$base" -d "$dir/q.txt" -l "$PRELOAD" -c 4 -q 200 -t 5 -D > "$dir/preload.txt" 2>&1
  echo "preload: $(awk '/Queries per second/ {print $4}' "$dir/preload.txt") q/s for $PRELOAD s"
fi
# The same 1,000 questions asked of replica 0's own named, for the ratio in the same run.
named_probe=$(python3 "$measure" probe "$dir/q.txt" --port $((base + 20)) --count 1000 --meta '{}')
python3 "$measure" probe "$dir/q.txt" --port "$base" --count "${WARM:-1000}" --meta '{}' > /dev/null
a=$(snap)
probe=$(python3 "$measure" probe "$dir/q.txt" --port "$base" --count 1000 --meta '{}')
b=$(snap)
dnsperf -s 127.0.0.1 -p "$base" -d "$dir/q.txt" -l 5 -c 4 -q 10 -t 5 -D > "$dir/dp.txt" 2>&1
c=$(snap)
qps=$(awk '/Queries per second/ {print $4}' "$dir/dp.txt")
completed=$(awk '/Queries completed/ {print $3}' "$dir/dp.txt")
echo "== $label: $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "probe: $probe"
echo "named probe: $named_probe"
echo "dnsperf -q 10: $qps q/s, $completed completed"
python3 - "$a" "$b" "$c" "${completed:-0}" <<'PY'
import sys
a, b, c = [{l.split()[0]: list(map(int, l.split()[1:])) for l in x.strip().splitlines()} for x in sys.argv[1:4]]
n, tick_us = max(int(sys.argv[4]), 1), 1e6 / 100
print("replica | ctx switches per sequential read | CPU us per sequential read | ctx per loaded read | CPU us per loaded read")
for i, p in enumerate(a):
    print(f"{i} | {(b[p][0] - a[p][0]) / 1000:.1f} | {(b[p][1] - a[p][1]) * tick_us / 1000:.0f} | "
          f"{(c[p][0] - b[p][0]) / n:.2f} | {(c[p][1] - b[p][1]) * tick_us / n:.1f}")
PY
curl -s "http://127.0.0.1:$((base + 30))/metrics" | grep -E '^sdns_vouched_reads_total'
