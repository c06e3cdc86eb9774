#!/usr/bin/env bash
# End-to-end benchmarks of sdns on this machine (loopback only), after the paper's Table 2
# (Cachin & Samar, DSN 2004, Section 5) plus read throughput. Figures: docs/BENCHMARKS.md (last section).
#
#  1. Latency: for each (n, corrupted) and protocol, start a real cluster (`sdns cluster up`,
#     threshold-signed zone) and time, one after another, BENCH_REPS reads (plain UDP query
#     through replica 0), adds and deletes (`nsupdate -k` to replica 0, wall time including
#     nsupdate's own SOA lookup, as the paper measured). Baseline in the same run: a plain named
#     of the same BIND build serving the same zone, signed with an ordinary RSASHA256 key made by
#     dnssec-keygen (the paper's (1,0) row), measured before and after the cluster runs.
#  2. Throughput: dnsperf through replica 0 of a 4-replica opt-te cluster, ordered reads and
#     `--reads local`, against dnsperf straight at that replica's named in the same run.
#  3. A markdown report (report.md) and the raw numbers (results.jsonl) in BENCH_OUT.
#  BENCH_PART=reads runs only the read-path benchmark instead (issue 12; docs/BENCHMARKS.md,
#  "Reads"): for each zone size, a 4-replica opt-te cluster whose zone has that many extra
#  hosts (A, AAAA, MX, PTR), per read mode: dnsperf -D with the operator query mix at several
#  -q values, alternating sdns replica 0 and its own named, then unloaded latency percentiles
#  (sequential UDP probes) of both. Report: reads.md next to results.jsonl.
#
# A configuration that fails (cluster does not come up, probe times out) is reported with the
# tail of its replica logs and the script goes on with the next one. Every process it starts is
# stopped on exit, failure or Ctrl-C (trap). Ports: BENCH_PORT_BASE (31000) .. +999, 127.0.0.1.
#
# Environment (defaults in brackets):
#   BENCH_REPS [20]            repetitions of each of read, add, delete per configuration
#   BENCH_CONFIGS ["1:0 4:0 4:1 7:0 7:1 7:2"]   n:corrupted pairs
#   BENCH_PROTOCOLS ["basic opt-proof opt-te"]  (n = 1 runs opt-te only; BENCH_N1_ALL=1 runs all)
#   BENCH_BITS [2048]          modulus size of the threshold key and of the baseline key
#   BENCH_THROUGHPUT [1]       0 skips part 2
#   BENCH_DNSPERF_SECONDS [10] BENCH_DNSPERF_CLIENTS [4] BENCH_DNSPERF_OUTSTANDING [20]
#   BENCH_PART [all]           reads: only the read-path benchmark
#   BENCH_READS_NAMES ["1000 10000"] BENCH_READS_Q ["10 50 200"] BENCH_READS_MODES ["ordered local"]
#   BENCH_READS_PROBES [2000]  sequential probes for the unloaded percentiles
#   BENCH_BUDGET_SECONDS [1500] no new configuration starts after this much run time
#   BENCH_SETTLE_SECONDS [3]   pause between `cluster up` and the first probe
#   BENCH_KEYS [target/bench-keys]  dealt key directories, one per n, reused across runs
#   BENCH_OUT [target/bench-cluster/<UTC time>]   BENCH_PORT_BASE [31000]
#   BENCH_WORK_PARENT [/tmp]   where the clusters' state directories go (/dev/shm: no fsync cost)
#   SDNS_BIN [<cargo target>/release/sdns]   SDNS_BIND_DIR [target/bind9]   BENCH_KEEP_WORK [0]
#   (SDNS_BIN should be an optimised build, as an operator runs: the release profile, or the
#   dev profile with CARGO_PROFILE_DEV_OPT_LEVEL=3; a plain dev build has the workspace's own
#   crates at opt-level 1. docs/BENCHMARKS.md says which build each figure comes from.)
set -uo pipefail   # no -e: a failing configuration is recorded and the others still run

ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE=$ROOT/scripts/bench
ZONE=example.test
REPS=${BENCH_REPS:-20}
CONFIGS=${BENCH_CONFIGS:-"1:0 4:0 4:1 7:0 7:1 7:2"}
PROTOCOLS=${BENCH_PROTOCOLS:-"basic opt-proof opt-te"}
BITS=${BENCH_BITS:-2048}
THROUGHPUT=${BENCH_THROUGHPUT:-1}
DP_SECONDS=${BENCH_DNSPERF_SECONDS:-10}
DP_CLIENTS=${BENCH_DNSPERF_CLIENTS:-4}
DP_OUTSTANDING=${BENCH_DNSPERF_OUTSTANDING:-20}
BUDGET=${BENCH_BUDGET_SECONDS:-1500}
KEYS=${BENCH_KEYS:-$ROOT/target/bench-keys}
OUT=${BENCH_OUT:-$ROOT/target/bench-cluster/$(date -u +%Y%m%dT%H%M%SZ)}
PORT_BASE=${BENCH_PORT_BASE:-31000}
BIND_DIR=${SDNS_BIND_DIR:-$ROOT/target/bind9}
SDNS=${SDNS_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/sdns}
# Per-step bounds: key generation (2048-bit safe primes) can take minutes on a busy box.
KEYGEN_TIMEOUT=${BENCH_KEYGEN_TIMEOUT:-900}
UP_TIMEOUT=${BENCH_UP_TIMEOUT:-240}
MEASURE_TIMEOUT=${BENCH_MEASURE_TIMEOUT:-600}
# After `cluster up` returns, replicas may still be finishing the zone signing's share exchange
# (slow under BASIC/OPT-PROOF with corrupted replicas); the first reads would time that, not reads.
SETTLE=${BENCH_SETTLE_SECONDS:-3}

START=$(date +%s)
# Absolute on purpose: `sdns cluster up --dir` with a relative path gives named relative paths
# after it has changed directory, and the replicas never answer (reported to the lead).
WORK=$(mktemp -d "${BENCH_WORK_PARENT:-/tmp}/sdns-bench.XXXXXX")
RESULTS=$OUT/results.jsonl
FAILURES=$OUT/failures.txt
mkdir -p "$OUT/logs" "$KEYS"
: > "$RESULTS"
: > "$FAILURES"

log() { echo "[bench $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >&2; }

# --- cleanup: whatever is running when the script ends, however it ends -------------------
ACTIVE_DIR="" ACTIVE_N="" BASE_PID=""
cleanup() {
  if [ -n "$ACTIVE_DIR" ]; then
    "$SDNS" cluster down --replicas "$ACTIVE_N" --dir "$ACTIVE_DIR" >/dev/null 2>&1
    ACTIVE_DIR=""
  fi
  if [ -n "$BASE_PID" ] && kill -0 "$BASE_PID" 2>/dev/null; then
    kill "$BASE_PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$BASE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$BASE_PID" 2>/dev/null
  fi
  BASE_PID=""
  [ "${BENCH_KEEP_WORK:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

over_budget() { [ $(( $(date +%s) - START )) -ge "$BUDGET" ]; }

meta() {  # meta KEY=VALUE ... -> JSON object (numbers stay numbers)
  python3 -c 'import json,sys
d={}
for a in sys.argv[1:]:
    k,v=a.split("=",1)
    d[k]=int(v) if v.lstrip("-").isdigit() else v
d["load1"]=float(open("/proc/loadavg").read().split()[0])
print(json.dumps(d))' "$@"
}

fail() {  # fail TAG WHAT [DIR N]: record a failure with the tail of every replica log
  local tag=$1 what=$2 dir=${3:-} n=${4:-0}
  log "FAILED $tag: $what"
  {
    echo "=== $tag: $what ($(date -u +%H:%M:%S))"
    if [ -n "$dir" ]; then
      for ((i = 0; i < n; i++)); do
        echo "--- $dir/replica-$i/sdns.log (last 25 lines)"
        tail -n 25 "$dir/replica-$i/sdns.log" 2>/dev/null
      done
    fi
  } >> "$FAILURES"
  echo "{\"tag\": \"$tag\", \"failed\": \"$what\"}" >> "$RESULTS"
}

save_logs() {  # keep each run's replica logs (and metrics) for later reading
  local tag=$1 dir=$2 n=$3
  mkdir -p "$OUT/logs/$tag"
  for ((i = 0; i < n; i++)); do
    cp "$dir/replica-$i/sdns.log" "$OUT/logs/$tag/replica-$i.log" 2>/dev/null
  done
}

# --- prerequisites ---------------------------------------------------------------------------
for tool in python3 nsupdate dnsperf timeout curl; do
  command -v "$tool" >/dev/null || { echo "bench: $tool not found" >&2; exit 1; }
done
[ -x "$BIND_DIR/sbin/named" ] || { echo "bench: no patched named in $BIND_DIR (patches/bind9/build.sh)" >&2; exit 1; }
if [ ! -x "$SDNS" ]; then
  log "building sdns (release)"
  (cd "$ROOT" && cargo build --release -p sdns --bin sdns) || { echo "bench: build failed" >&2; exit 1; }
fi

log "output in $OUT; work dir $WORK; $(nproc) cores; $(uptime)"
{
  echo "date: $(date -u +%FT%TZ)"; echo "uptime: $(uptime)"; echo "cpus: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo; echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null)"
  echo "sdns: $SDNS ($(stat -c '%y' "$SDNS" 2>/dev/null))"
  echo "reps=$REPS bits=$BITS configs=\"$CONFIGS\" protocols=\"$PROTOCOLS\""
  echo "dnsperf: -l $DP_SECONDS -c $DP_CLIENTS -q $DP_OUTSTANDING (no rate limit)"
} > "$OUT/machine.txt"

# --- keys: one dealt directory per n, made once and copied for every run --------------------
deal() {  # deal N -> prints the dealt directory, or fails
  local n=$1 dir=$KEYS/n$1-$BITS
  if [ ! -f "$dir/replica-0/share.json" ]; then
    log "dealing keys for n=$n ($BITS bits; safe primes take a while)"
    rm -rf "$dir"
    timeout "$KEYGEN_TIMEOUT" "$SDNS" keygen --replicas "$n" --bits "$BITS" --zone "$ZONE" \
      --bind-dir "$BIND_DIR" --out "$dir" > "$OUT/logs/keygen-n$n.log" 2>&1 || { rm -rf "$dir"; return 1; }
  fi
  echo "$dir"
}

# --- baseline: plain named, same build, ordinary key, same zone and TSIG key ----------------
BASE_PORT=$((PORT_BASE + 990))
start_baseline() {
  local dealt=$1 b=$WORK/baseline
  mkdir -p "$b/keys"
  # The n = 1 demo zone: the same records a 1-replica cluster serves.
  cp "$dealt/zone.db" "$b/zone.db"
  cp "$dealt/tsig.key" "$b/tsig.key"
  local key
  key=$("$BIND_DIR/bin/dnssec-keygen" -q -K "$b/keys" -f KSK -a RSASHA256 -b "$BITS" -n ZONE "$ZONE") || return 1
  # The DNSKEY goes into the zone; one key (a KSK, -z) signs everything, as the cluster's
  # threshold key does (sdns also signs with -z).
  cat "$b/keys/$key.key" >> "$b/zone.db"
  "$BIND_DIR/bin/dnssec-signzone" -q -z -d "$b" -K "$b/keys" -o "$ZONE" -f "$b/zone.signed" "$b/zone.db" \
    "$b/keys/$key" > "$b/signzone.log" 2>&1 || return 1
  local keyname
  keyname=$(sed -n 's/^key "\([^"]*\)".*/\1/p' "$b/tsig.key")
  # The determinism options sdns gives its named (named-glue NamedConf), so both sign alike.
  cat > "$b/named.conf" <<EOF
include "$b/tsig.key";
options {
	directory "$b";
	pid-file "$b/named.pid";
	session-keyfile "$b/session.key";
	listen-on port $BASE_PORT { 127.0.0.1; };
	listen-on-v6 { none; };
	recursion no;
	dnssec-validation no;
	notify no;
	answer-cookie no;
	rrset-order { order none; };
	version none;
};
controls { };
zone "$ZONE" {
	type primary;
	file "$b/zone.signed";
	journal "$b/zone.signed.jnl";
	key-directory "$b/keys";
	sig-validity-interval 30 30;
	dnssec-update-mode no-resign;
	serial-update-method increment;
	update-policy { grant "$keyname" zonesub ANY; };
};
EOF
  # Same flags as the replicas' named (named-glue Supervisor: foreground, IPv4, 2 worker threads); no signer socket
  # in the environment, so the patched build behaves as stock BIND.
  env -u SDNS_SIGNER_SOCKET "$BIND_DIR/sbin/named" -g -4 -n 2 -c "$b/named.conf" > "$OUT/logs/baseline-named.log" 2>&1 &
  BASE_PID=$!
  for _ in $(seq 100); do
    if dig +tries=1 +time=1 @127.0.0.1 -p "$BASE_PORT" "$ZONE" SOA +dnssec 2>/dev/null | grep -q RRSIG; then return 0; fi
    kill -0 "$BASE_PID" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}

measure_baseline() {  # measure_baseline TAG
  local out
  out=$(timeout "$MEASURE_TIMEOUT" python3 "$HERE/measure.py" latency --port "$BASE_PORT" --zone "$ZONE" \
    --key "$WORK/baseline/tsig.key" --reps "$REPS" --tag "$1" \
    --meta "$(meta kind=baseline n=1 corrupted=0 protocol=plain-named)") && [ -n "$out" ] \
    && echo "$out" >> "$RESULTS" && log "baseline $1: $(summ "$out")" || fail "$1" "baseline measurement failed or timed out"
}

summ() {  # one-line summary of a latency result
  python3 -c 'import json,sys
r=json.loads(sys.argv[1]); f=lambda k: "%s %.1f/%.1f ms" % (k, r[k].get("mean_ms",float("nan")), r[k].get("median_ms",float("nan")))
print(", ".join(f(k) for k in ("read","add","delete")) + ", errors %d" % r["errors"])' "$1"
}

# --- one cluster configuration ------------------------------------------------------------------
RUN=0
ports() {  # each run gets its own port block, so nothing lingering from the last run collides
  RUN=$((RUN + 1))
  local base=$((PORT_BASE + 40 * RUN))
  [ $((base + 40)) -lt "$BASE_PORT" ] || { echo "bench: out of ports" >&2; return 1; }
  CLIENT=$base PEER=$((base + 10)) NAMED=$((base + 20)) METRICS=$((base + 30))
}

up() {  # up DIR N PROTOCOL CORRUPT [extra args]
  local dir=$1 n=$2 proto=$3 corrupt=$4; shift 4
  ACTIVE_DIR=$dir ACTIVE_N=$n
  timeout "$UP_TIMEOUT" "$SDNS" cluster up --replicas "$n" --dir "$dir" --bits "$BITS" --zone "$ZONE" \
    --bind-dir "$BIND_DIR" --protocol "$proto" ${corrupt:+--corrupt "$corrupt"} \
    --client-port "$CLIENT" --peer-port "$PEER" --named-port "$NAMED" --metrics-port "$METRICS" "$@"
}

down() {
  [ -n "$ACTIVE_DIR" ] || return 0
  local t0=$SECONDS
  "$SDNS" cluster down --replicas "$ACTIVE_N" --dir "$ACTIVE_DIR" >/dev/null 2>&1
  log "cluster down took $((SECONDS - t0)) s"
  ACTIVE_DIR=""
}

latency_run() {  # latency_run N CORRUPTED PROTOCOL
  local n=$1 k=$2 proto=$3 tag="n$1c$2-$3" dealt corrupt=""
  dealt=$(deal "$n") || { fail "$tag" "keygen for n=$n failed (see logs/keygen-n$n.log)"; return; }
  # Corrupted replicas: 1, then 1,2 (never replica 0, the one the client talks to).
  [ "$k" -ge 1 ] && corrupt=$(seq -s, 1 "$k")
  ports || return
  local dir=$WORK/$tag
  rm -rf "$dir"; cp -a "$dealt" "$dir"
  log "== $tag: n=$n corrupted=${corrupt:-none} protocol=$proto (client port $CLIENT)"
  local t0=$(date +%s.%N)
  if ! up "$dir" "$n" "$proto" "$corrupt" > "$OUT/logs/$tag.up.log" 2>&1; then
    fail "$tag" "cluster up failed or timed out after ${UP_TIMEOUT}s: $(tail -n 3 "$OUT/logs/$tag.up.log" | tr '\n' ' ')" "$dir" "$n"
    save_logs "$tag" "$dir" "$n"; down; rm -rf "$dir"; return
  fi
  local up_s; up_s=$(python3 -c "import time,sys; print(round(time.time()-float(sys.argv[1]),1))" "$t0")
  sleep "$SETTLE"
  local out
  out=$(timeout "$MEASURE_TIMEOUT" python3 "$HERE/measure.py" latency --port "$CLIENT" --zone "$ZONE" \
    --key "$dir/tsig.key" --reps "$REPS" --tag "$tag" \
    --meta "$(meta kind=sdns n="$n" corrupted="$k" protocol="$proto" corrupt_ids="${corrupt:-}" up_seconds="$up_s")")
  if [ -z "$out" ]; then
    fail "$tag" "latency probe failed or timed out after ${MEASURE_TIMEOUT}s" "$dir" "$n"
  else
    echo "$out" >> "$RESULTS"
    log "$tag (up in ${up_s}s): $(summ "$out")"
    if python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["errors"] else 1)' "$out"; then
      fail "$tag" "some operations failed: $(python3 -c 'import json,sys; print(" | ".join(json.loads(sys.argv[1])["error_messages"][:3]))' "$out")" "$dir" "$n"
    fi
  fi
  curl -s -m 3 "http://127.0.0.1:$METRICS/metrics" > "$OUT/logs/$tag.metrics.txt" 2>/dev/null
  down; save_logs "$tag" "$dir" "$n"; rm -rf "$dir"
}

dnsperf_at() {  # dnsperf_at TAG PORT META...
  local tag=$1 port=$2; shift 2
  timeout $((DP_SECONDS + 60)) dnsperf -s 127.0.0.1 -p "$port" -d "$WORK/queries.txt" -l "$DP_SECONDS" \
    -c "$DP_CLIENTS" -q "$DP_OUTSTANDING" -t 5 > "$OUT/logs/$tag.dnsperf.txt" 2>&1
  local out
  out=$(python3 "$HERE/measure.py" dnsperf "$OUT/logs/$tag.dnsperf.txt" --meta "$(meta tag="$tag" "$@")")
  echo "$out" >> "$RESULTS"
  log "dnsperf $tag: $out"
}

throughput() {
  local n=4 dealt dir=$WORK/throughput
  dealt=$(deal $n) || { fail throughput "keygen for n=4 failed"; return; }
  python3 "$HERE/measure.py" queryfile "$ZONE" > "$WORK/queries.txt"
  rm -rf "$dir"; cp -a "$dealt" "$dir"
  for reads in ordered local; do
    over_budget && { fail "tput-$reads" "skipped: time budget of ${BUDGET}s used up"; continue; }
    ports || return
    log "== throughput: n=4 opt-te, reads $reads"
    # The second start reuses the directory: the zone is already signed (marker file).
    if ! up "$dir" $n opt-te "" --reads "$reads" > "$OUT/logs/tput-$reads.up.log" 2>&1; then
      fail "tput-$reads" "cluster up failed: $(tail -n 3 "$OUT/logs/tput-$reads.up.log" | tr '\n' ' ')" "$dir" $n
      save_logs "tput-$reads" "$dir" $n; down; continue
    fi
    sleep "$SETTLE"
    dnsperf_at "tput-$reads-sdns" "$CLIENT" kind=tput target=sdns reads="$reads"
    dnsperf_at "tput-$reads-named" "$NAMED" kind=tput target=named reads="$reads"
    curl -s -m 3 "http://127.0.0.1:$METRICS/metrics" > "$OUT/logs/tput-$reads.metrics.txt" 2>/dev/null
    down; save_logs "tput-$reads" "$dir" $n
  done
  rm -rf "$dir"
}

# --- read path (issue 12) ------------------------------------------------------------------------
reads_part() {
  local n=4 dealt names mode q
  dealt=$(deal $n) || { fail reads "keygen for n=4 failed"; return; }
  for names in ${BENCH_READS_NAMES:-1000 10000}; do
    local dir=$WORK/reads-$names queries=$WORK/mix-$names.txt
    rm -rf "$dir"; cp -a "$dealt" "$dir"
    for ((i = 0; i < n; i++)); do python3 "$HERE/measure.py" bigzone "$ZONE" "$names" >> "$dir/replica-$i/zone.db"; done
    python3 "$HERE/measure.py" mixfile "$ZONE" "$names" > "$queries"
    for mode in ${BENCH_READS_MODES:-ordered local}; do
      over_budget && { fail "reads-$names-$mode" "skipped: time budget of ${BUDGET}s used up"; continue; }
      ports || return
      local tag=reads-$names-$mode t0=$SECONDS
      log "== reads: $names names, $mode reads (the first start signs the zone)"
      if ! up "$dir" $n opt-te "" --reads "$mode" > "$OUT/logs/$tag.up.log" 2>&1; then
        fail "$tag" "cluster up failed: $(tail -n 3 "$OUT/logs/$tag.up.log" | tr '\n' ' ')" "$dir" $n
        save_logs "$tag" "$dir" $n; down; continue
      fi
      log "$tag: up in $((SECONDS - t0)) s"
      sleep "$SETTLE"
      for q in ${BENCH_READS_Q:-10 50 200}; do
        for target in sdns named; do
          local port=$CLIENT; [ $target = named ] && port=$NAMED
          timeout $((DP_SECONDS + 60)) dnsperf -s 127.0.0.1 -p "$port" -d "$queries" -l "$DP_SECONDS" \
            -c "$DP_CLIENTS" -q "$q" -t 5 -D > "$OUT/logs/$tag-q$q-$target.dnsperf.txt" 2>&1
          local out
          out=$(python3 "$HERE/measure.py" dnsperf "$OUT/logs/$tag-q$q-$target.dnsperf.txt" \
            --meta "$(meta kind=reads names="$names" reads="$mode" q="$q" target=$target)")
          echo "$out" >> "$RESULTS"; log "dnsperf $tag q$q $target: $out"
        done
      done
      for target in sdns named; do
        local port=$CLIENT; [ $target = named ] && port=$NAMED
        local out
        out=$(timeout "$MEASURE_TIMEOUT" python3 "$HERE/measure.py" probe "$queries" --port "$port" \
          --count "${BENCH_READS_PROBES:-2000}" --meta "$(meta kind=reads-probe names="$names" reads="$mode" target=$target)")
        echo "$out" >> "$RESULTS"; log "probe $tag $target: $out"
      done
      curl -s -m 3 "http://127.0.0.1:$METRICS/metrics" > "$OUT/logs/$tag.metrics.txt" 2>/dev/null
      # The peers' too: what a read costs the replicas that were not asked (their named
      # queries show as read-cache misses).
      for ((i = 1; i < n; i++)); do
        curl -s -m 3 "http://127.0.0.1:$((METRICS + i))/metrics" > "$OUT/logs/$tag.metrics.r$i.txt" 2>/dev/null
      done
      down; save_logs "$tag" "$dir" $n
    done
    rm -rf "$dir"
  done
  python3 - "$RESULTS" > "$OUT/reads.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tp = {(r["names"], r["reads"], r["q"], r["target"]): r for r in rows if r.get("kind") == "reads"}
pr = {(r["names"], r["reads"], r["target"]): r for r in rows if r.get("kind") == "reads-probe"}
print("| names | reads | -q | sdns q/s | named q/s | ratio | sdns avg ms | named avg ms | lost sdns/named |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for (names, mode, q, target), s in sorted(tp.items()):
    if target != "sdns":
        continue
    d = tp.get((names, mode, q, "named"), {})
    ratio = s["qps"] / d["qps"] if s.get("qps") and d.get("qps") else float("nan")
    ms = lambda r: "%.3f" % (r["avg_latency_s"] * 1000) if r.get("avg_latency_s") is not None else "-"
    print(f"| {names} | {mode} | {q} | {s.get('qps') or 0:.0f} | {d.get('qps') or 0:.0f} | {ratio:.2f} | {ms(s)} | {ms(d)} | {s.get('lost')}/{d.get('lost')} |")
print()
print("| names | reads | sdns p50 / p90 / p99 ms | named p50 / p90 / p99 ms | added p50 ms | answered sdns/named |")
print("| --- | --- | --- | --- | --- | --- |")
for (names, mode, target), s in sorted(pr.items()):
    if target != "sdns":
        continue
    d = pr.get((names, mode, "named"), {})
    trio = lambda r: " / ".join("%.3f" % r[k] if r.get(k) is not None else "-" for k in ("p50_ms", "p90_ms", "p99_ms"))
    added = "%.3f" % (s["p50_ms"] - d["p50_ms"]) if s.get("p50_ms") is not None and d.get("p50_ms") is not None else "-"
    print(f"| {names} | {mode} | {trio(s)} | {trio(d)} | {added} | {s.get('answered')}/{d.get('answered')} of {s.get('probes')} |")
PY
  cat "$OUT/reads.md"
}

# --- main -----------------------------------------------------------------------------------------
if [ "${BENCH_PART:-all}" = reads ]; then
  reads_part
  log "done in $(( $(date +%s) - START )) s; raw numbers $RESULTS; report $OUT/reads.md"
  if [ -s "$FAILURES" ]; then grep '^===' "$FAILURES" >&2; exit 2; fi
  exit 0
fi

if dealt1=$(deal 1) && start_baseline "$dealt1"; then
  measure_baseline base-before
else
  fail baseline "plain named did not start (see logs/baseline-named.log, $WORK/baseline/signzone.log)"
fi

for cfg in $CONFIGS; do
  n=${cfg%%:*} k=${cfg##*:}
  protos=$PROTOCOLS
  [ "$n" = 1 ] && [ "${BENCH_N1_ALL:-0}" != 1 ] && protos=opt-te
  for proto in $protos; do
    if over_budget; then fail "n${n}c${k}-$proto" "skipped: time budget of ${BUDGET}s used up"; continue; fi
    latency_run "$n" "$k" "$proto"
  done
done

[ -n "$BASE_PID" ] && measure_baseline base-after
[ "$THROUGHPUT" = 1 ] && throughput

python3 "$HERE/report.py" "$RESULTS" > "$OUT/report.md"
cat "$OUT/report.md"
echo "{\"total_seconds\": $(( $(date +%s) - START ))}" >> "$RESULTS"
log "done in $(( $(date +%s) - START )) s; raw numbers $RESULTS; report $OUT/report.md"
if [ -s "$FAILURES" ]; then
  log "FAILURES (details in $FAILURES):"; grep '^===' "$FAILURES" >&2
  exit 2
fi
