#!/usr/bin/env bash
# Throughput under attack on real processes (issue 10): for the fault-free cluster and for one
# Byzantine replica in each mode (`sdns cluster up --byzantine ID:MODE`), n = 4 on loopback,
# measure in the same run
#   - ordered reads/s: dnsperf through an honest replica (replica 3) for BENCH_SECONDS, and
#   - updates/s: BENCH_UPDATERS concurrent loops of `nsupdate -k` (one add each) through
#     replica 3 for BENCH_SECONDS, counting acknowledged updates;
# and print a markdown table with the ratio of each mode to the fault-free run. The Byzantine
# replica is replica 1, except for the modes that act as primary (equivocating-primary,
# view-change-poisoner, origin-forger, budget-hog, and the writers oversized-writes and update-flooder, whose system tests run them there: replica 0, the primary of view 0).
# With BENCH_SAMPLES > 1 every mode (the fault-free run too) is measured that many times, the
# samples of one round one after another so that a noisy minute touches every mode alike; the
# table gives each mode's median and range, and the ratio of medians.
#
# Environment (defaults in brackets):
#   BENCH_MODES ["none silent crash-after-200 equivocating-primary view-change-poisoner
#                 forged-relays peer-flooder status-spammer corrupt-shares garbage-shares wrong-answers
#                 wrong-vouches origin-forger budget-hog oversized-writes update-flooder snapshot-leech"]
#   BENCH_SAMPLES [1]  BENCH_SECONDS [10]  BENCH_UPDATERS [4]  BENCH_DNSPERF_CLIENTS [4]  BENCH_DNSPERF_OUTSTANDING [20]
#   BENCH_BITS [1024]   BENCH_PORT_BASE [33000]   BENCH_OUT [target/bench-byzantine/<UTC time>]
#   SDNS_BIN [target/release/sdns, else target/debug/sdns]   SDNS_BIND_DIR [target/bind9]
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODES=${BENCH_MODES:-"none silent crash-after-200 equivocating-primary view-change-poisoner forged-relays peer-flooder status-spammer corrupt-shares garbage-shares wrong-answers wrong-vouches origin-forger budget-hog oversized-writes update-flooder snapshot-leech"}
SAMPLES=${BENCH_SAMPLES:-1}
SECONDS_EACH=${BENCH_SECONDS:-10}
UPDATERS=${BENCH_UPDATERS:-4}
DP_CLIENTS=${BENCH_DNSPERF_CLIENTS:-4}
DP_OUTSTANDING=${BENCH_DNSPERF_OUTSTANDING:-20}
BITS=${BENCH_BITS:-1024}
PORT_BASE=${BENCH_PORT_BASE:-33000}
OUT=${BENCH_OUT:-$ROOT/target/bench-byzantine/$(date -u +%Y%m%dT%H%M%SZ)}
BIND_DIR=${SDNS_BIND_DIR:-$ROOT/target/bind9}
SDNS=${SDNS_BIN:-}
if [ -z "$SDNS" ]; then
  SDNS=$ROOT/target/release/sdns
  [ -x "$SDNS" ] || SDNS=$ROOT/target/debug/sdns
fi
N=4
THROUGH=3

for tool in dnsperf timeout python3; do
  command -v "$tool" >/dev/null || { echo "bench-byzantine: $tool not found" >&2; exit 1; }
done
[ -x "$BIND_DIR/sbin/named" ] || { echo "bench-byzantine: no patched named in $BIND_DIR" >&2; exit 1; }
[ -x "$SDNS" ] || { echo "bench-byzantine: no sdns binary at $SDNS (cargo build -p sdns --bin sdns)" >&2; exit 1; }
NSUPDATE=$BIND_DIR/bin/nsupdate

mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/sdns-bench-byz.XXXXXX)
ACTIVE=""
cleanup() {
  [ -n "$ACTIVE" ] && "$SDNS" cluster down --replicas "$N" --dir "$ACTIVE" >/dev/null 2>&1
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log() { echo "[bench-byzantine $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >&2; }

ports=(--client-port $((PORT_BASE + 1)) --peer-port $((PORT_BASE + 101)) --named-port $((PORT_BASE + 201)) --metrics-port $((PORT_BASE + 301)))
CLIENT=$((PORT_BASE + 1 + THROUGH))

# One dealt key, copied for every run (keys do not depend on the modes).
KEYS=$WORK/keys
"$SDNS" keygen --replicas "$N" --bits "$BITS" --bind-dir "$BIND_DIR" --out "$KEYS" "${ports[@]}" > "$OUT/keygen.log" 2>&1 \
  || { echo "bench-byzantine: keygen failed (see $OUT/keygen.log)" >&2; exit 1; }

reads() {  # ordered reads/s through replica $THROUGH
  printf 'www.example.test A\nexample.test SOA\nmail.example.test A\n' > "$WORK/queries"
  dnsperf -s 127.0.0.1 -p "$CLIENT" -d "$WORK/queries" -l "$SECONDS_EACH" -c "$DP_CLIENTS" -q "$DP_OUTSTANDING" 2>&1 \
    | tee "$1" | sed -n 's/.*Queries per second: *\([0-9.]*\).*/\1/p'
}

updates() {  # acknowledged updates/s through replica $THROUGH
  local dir=$1 end=$(( $(date +%s) + SECONDS_EACH ))
  for ((u = 0; u < UPDATERS; u++)); do
    (
      k=0 ok=0
      while [ "$(date +%s)" -lt "$end" ]; do
        k=$((k + 1))
        if printf 'server 127.0.0.1 %s\nzone example.test\nupdate add u%s-%s.example.test 300 A 192.0.2.1\nsend\n' "$CLIENT" "$u" "$k" \
          | timeout 30 "$NSUPDATE" -t 20 -k "$dir/tsig.key" >/dev/null 2>&1; then
          ok=$((ok + 1))
        fi
      done
      echo "$ok" > "$WORK/updater-$u"
    ) &
  done
  wait
  local total=0
  for ((u = 0; u < UPDATERS; u++)); do total=$((total + $(cat "$WORK/updater-$u" 2>/dev/null || echo 0))); done
  python3 -c "print(f'{$total / $SECONDS_EACH:.2f}')"
}

: > "$OUT/results.tsv"
for ((sample = 1; sample <= SAMPLES; sample++)); do
for mode in $MODES; do
  dir=$WORK/run-$mode
  rm -rf "$dir"; cp -r "$KEYS" "$dir"
  args=()
  if [ "$mode" != none ]; then
    case $mode in equivocating-primary|view-change-poisoner|origin-forger|budget-hog|oversized-writes|update-flooder) who=0 ;; *) who=1 ;; esac
    args=(--byzantine "$who:$mode")
  fi
  log "mode $mode (sample $sample of $SAMPLES): cluster up"
  ACTIVE=$dir
  if ! timeout 300 "$SDNS" cluster up --replicas "$N" --bits "$BITS" --bind-dir "$BIND_DIR" --dir "$dir" "${ports[@]}" "${args[@]}" > "$OUT/up-$mode.log" 2>&1; then
    log "mode $mode: cluster up failed (see $OUT/up-$mode.log)"
    printf '%s\tfailed\tfailed\n' "$mode" >> "$OUT/results.tsv"
    "$SDNS" cluster down --replicas "$N" --dir "$dir" >/dev/null 2>&1; ACTIVE=""
    continue
  fi
  sleep 2
  r=$(reads "$OUT/dnsperf-$mode.txt"); r=${r:-0}
  w=$(updates "$dir")
  log "mode $mode: reads/s $r, updates/s $w"
  printf '%s\t%s\t%s\n' "$mode" "$r" "$w" >> "$OUT/results.tsv"
  "$SDNS" cluster status --replicas "$N" --dir "$dir" "${ports[@]}" > "$OUT/status-$mode.txt" 2>&1
  for ((i = 0; i < N; i++)); do cp "$dir/replica-$i/sdns.log" "$OUT/replica-$i-$mode.log" 2>/dev/null; done
  "$SDNS" cluster down --replicas "$N" --dir "$dir" >/dev/null 2>&1; ACTIVE=""
done
done

python3 - "$OUT/results.tsv" <<'EOF' | tee "$OUT/report.md"
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
modes, samples = [], {}
for mode, reads, writes in rows:
    if mode not in samples:
        modes.append(mode)
        samples[mode] = ([], [])
    for i, v in enumerate((reads, writes)):
        try:
            samples[mode][i].append(float(v))
        except ValueError:
            pass  # a run whose cluster did not come up counts as no sample
def cell(vals):
    if not vals:
        return "failed", None
    med = statistics.median(vals)
    spread = f" ({min(vals):g}-{max(vals):g})" if len(vals) > 1 else ""
    return f"{med:g}{spread}", med
base = samples.get("none")
base_med = [statistics.median(v) if v else None for v in base] if base else [None, None]
print("| mode | samples | ordered reads/s | ratio | updates/s | ratio | >= 0.5x |")
print("|---|---:|---:|---:|---:|---:|---|")
for mode in modes:
    r_txt, r_med = cell(samples[mode][0])
    w_txt, w_med = cell(samples[mode][1])
    ratios = []
    for med, b in ((r_med, base_med[0]), (w_med, base_med[1])):
        ratios.append(f"{med / b:.2f}" if med is not None and b else "-")
    ok = "yes" if all(x != "-" and float(x) >= 0.5 for x in ratios) else "**no**"
    n = max(len(samples[mode][0]), len(samples[mode][1]))
    print(f"| {mode} | {n} | {r_txt} | {ratios[0]} | {w_txt} | {ratios[1]} | {ok} |")
EOF
