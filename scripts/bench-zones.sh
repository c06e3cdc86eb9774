#!/usr/bin/env bash
# Many zones in one cluster (issue 28: "1,000 zones in one cluster: figures recorded (dealing,
# start-up, RSS, checkpoint time)"), and how each figure grows with the number of zones.
# Figures: docs/BENCHMARKS.md, "1,000 zones (issue 28)".
#
# For each N in BENCH_ZONE_COUNTS, one after another, a 4-replica cluster on 127.0.0.1 serving
# N zones (z0001.zones.test. ..., the dealer's small demo zone each, one threshold key each):
#  1. dealing: `sdns keygen` with N --zone flags: wall time, bytes and files on disk;
#  2. start-up: every replica started as `sdns cluster up` starts it (`sdns run`), timed until
#     the first, middle and last zone answer their SOA at every replica (sampled), then until
#     every zone does at every replica (full sweeps: `dig +dnssec SOA`, one dig -f batch per
#     replica, the four at once, repeated until all answer); RSS (VmRSS; VmHWM, the peak) of each replica's
#     sdns and named from /proc, and replica 0's open descriptors;
#  3. signing: an ordered sign-zone for every zone (`sdns sign-zone`, one after another) when
#     N <= BENCH_SIGN_ALL_UP_TO, else for the first, middle and last zone only: each
#     installation of a signed zone restarts named, which then loads all N zones, so signing
#     every zone costs O(N^2) (docs/BENCHMARKS.md); the named restart times of those
#     installations (replica 0's log), then a full sweep counting the SOAs with an RRSIG;
#  4. an update to the middle zone (nsupdate -k with that zone's own key, through replica 1),
#     timed, and seen at every replica; then BENCH_READS reads of random zones' www A through
#     replica 0 (ordered reads; dig's query times: p50, p95, max); they order enough batches
#     for checkpoints (`--checkpoint-interval`, BENCH_CHECKPOINT_INTERVAL) after the update;
#  5. the checkpoint cost from replica 0's metrics: sdns_checkpoint_digest_seconds (reading and
#     digesting every zone from named for the last checkpoint after a change),
#     sdns_checkpoint_zones_read, sdns_snapshot_bytes and sdns_snapshot_write_seconds;
#  6. restart: `sdns cluster down`, every replica started again, timed until every zone
#     answers at every replica (and how many answer signed), RSS again.
# Report: report.md (one row per N) and results.jsonl in BENCH_OUT, with the load average at
# each step: times on a shared box grow with its load; memory, bytes and counts do not.
#
# Ports: the first base from BENCH_PORT_BASE on (steps of 100) of which none of the 16 ports
# used is in use (client base+0.., peer base+10.., named base+20.., metrics base+30..); below
# Linux's ephemeral range (32768-60999), where another process's outgoing connection can take
# a port between two starts (named then cannot bind its TCP port). Every
# cluster is stopped on exit, failure or Ctrl-C (trap); a configuration that fails is recorded
# with its replica logs' tails in failures.txt, and the next N runs.
#
# Environment (defaults in brackets):
#   BENCH_ZONE_COUNTS ["10 100 1000"]   BENCH_ALGORITHM [13] (13 and 15 deal in milliseconds;
#   8 makes two safe primes per zone, minutes each)   BENCH_SIGN_ALL_UP_TO [100]
#   BENCH_READS [200]   BENCH_CHECKPOINT_INTERVAL [16]   BENCH_UP_TIMEOUT [600] seconds
#   BENCH_OUT [target/bench-zones/<UTC time>]   BENCH_PORT_BASE [20000]
#   BENCH_WORK_PARENT [/tmp]   BENCH_KEEP_WORK [0]
#   SDNS_BIN [<cargo target>/release/sdns]   SDNS_BIND_DIR [target/bind9]
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
COUNTS=${BENCH_ZONE_COUNTS:-"10 100 1000"}
ALG=${BENCH_ALGORITHM:-13}
SIGN_ALL=${BENCH_SIGN_ALL_UP_TO:-100}
READS=${BENCH_READS:-200}
CKPT=${BENCH_CHECKPOINT_INTERVAL:-16}
UP_TIMEOUT=${BENCH_UP_TIMEOUT:-600}
OUT=${BENCH_OUT:-$ROOT/target/bench-zones/$(date -u +%Y%m%dT%H%M%SZ)}
PORT_FROM=${BENCH_PORT_BASE:-20000}
BIND_DIR=${SDNS_BIND_DIR:-$ROOT/target/bind9}
SDNS=${SDNS_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/sdns}
REPLICAS=4
WORK=$(mktemp -d "${BENCH_WORK_PARENT:-/tmp}/sdns-zones.XXXXXX")
RESULTS=$OUT/results.jsonl
mkdir -p "$OUT/logs"
: > "$RESULTS"

log() { echo "[bench-zones $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >&2; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$1" "$(now)"; }
load1() { cut -d' ' -f1 /proc/loadavg; }
timed_out() { python3 -c "import sys; sys.exit(float(sys.argv[2]) - float(sys.argv[1]) < float(sys.argv[3]))" "$1" "$(now)" "$UP_TIMEOUT"; }

ACTIVE_DIR="" ACTIVE_FLAGS=()
cleanup() {
  if [ -n "$ACTIVE_DIR" ]; then
    "$SDNS" cluster down "${ACTIVE_FLAGS[@]}" --dir "$ACTIVE_DIR" >/dev/null 2>&1
    ACTIVE_DIR=""
  fi
  [ "${BENCH_KEEP_WORK:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

for tool in python3 dig nsupdate curl ss setsid; do
  command -v "$tool" >/dev/null || { echo "bench-zones: $tool not found" >&2; exit 1; }
done
[ -x "$BIND_DIR/sbin/named" ] || { echo "bench-zones: no patched named in $BIND_DIR (patches/bind9/build.sh)" >&2; exit 1; }
[ -x "$SDNS" ] || { echo "bench-zones: no $SDNS (nice -n 19 cargo build --release -p sdns)" >&2; exit 1; }

# A base none of whose 16 ports (TCP or UDP, any state) is in use.
free_base() {
  local base=$PORT_FROM used clash off
  used=$(ss -Htanu 2>/dev/null | awk '{print $5}' | sed 's/.*://' | sort -u)
  while [ "$base" -lt 65000 ]; do
    clash=0
    for off in 0 1 2 3 10 11 12 13 20 21 22 23 30 31 32 33; do
      if grep -qx "$((base + off))" <<< "$used"; then clash=1; break; fi
    done
    [ "$clash" = 0 ] && { echo "$base"; return 0; }
    base=$((base + 100))
  done
  return 1
}

zone_name() { printf 'z%04d.zones.test.' "$1"; }

# Every zone's SOA +dnssec at one replica (one dig -f batch): "answered signed", the answers
# with the SOA and those that also carry its RRSIG.
sweep_replica() {  # sweep_replica PORT N
  local port=$1 n=$2 z
  local batch=$WORK/sweep-$port.txt
  : > "$batch"
  for ((z = 1; z <= n; z++)); do
    echo "@127.0.0.1 -p $port $(zone_name "$z") SOA +dnssec +noall +answer +tries=2 +time=3" >> "$batch"
  done
  dig -f "$batch" 2>/dev/null | awk '$4 == "SOA" {a++} $4 == "RRSIG" && $5 == "SOA" {s++} END {print a + 0, s + 0}'
}

# Every zone at every replica, the replicas at once: "answered signed seconds".
sweep() {  # sweep BASE N
  local base=$1 n=$2 t0 answered=0 signed=0 i out
  t0=$(now)
  for ((i = 0; i < REPLICAS; i++)); do
    sweep_replica "$((base + i))" "$n" > "$WORK/swept-$i" &
  done
  wait
  for ((i = 0; i < REPLICAS; i++)); do
    out=$(cat "$WORK/swept-$i")
    answered=$((answered + ${out% *})) signed=$((signed + ${out#* }))
  done
  echo "$answered $signed $(since "$t0")"
}

# Sweeps until every zone answers its SOA at every replica: "seconds_since_T0 signed".
wait_all_answer() {  # wait_all_answer BASE N T0
  local base=$1 n=$2 t0=$3 out
  while true; do
    out=$(sweep "$base" "$n")
    if [ "${out%% *}" -ge $((n * REPLICAS)) ]; then
      out=${out#* }
      echo "$(since "$t0") ${out%% *}"
      return 0
    fi
    timed_out "$t0" && { echo "timeout ${out%% *}"; return 1; }
    sleep 1
  done
}

# Until the first, middle and last zone answer their SOA at every replica: seconds since T0.
wait_sampled() {  # wait_sampled BASE N T0
  local base=$1 n=$2 t0=$3 i z ok
  while true; do
    ok=1
    for ((i = 0; i < REPLICAS && ok; i++)); do
      for z in "$(zone_name 1)" "$(zone_name $(((n + 1) / 2)))" "$(zone_name "$n")"; do
        dig +tries=1 +time=1 @127.0.0.1 -p "$((base + i))" "$z" SOA +noall +answer 2>/dev/null | awk '$4 == "SOA"' | grep -q . || { ok=0; break; }
      done
    done
    [ "$ok" = 1 ] && { since "$t0"; return 0; }
    timed_out "$t0" && { echo timeout; return 1; }
    sleep 0.3
  done
}

# Starts every replica as `sdns cluster up` does (`sdns run`, a process group of its own, the
# pid file `cluster down` reads); the waiting is the script's, so start-up is timed apart
# from the signing.
start_replicas() {  # start_replicas DIR
  local dir=$1 i
  for ((i = 0; i < REPLICAS; i++)); do
    setsid "$SDNS" run --config "$dir/replica-$i/replica.toml" < /dev/null >> "$dir/replica-$i/sdns.log" 2>&1 &
    echo $! > "$dir/replica-$i/sdns.pid"
  done
}

rss_kib() {  # rss_kib PIDFILE FIELD -> KiB, 0 when the process is gone
  local pid v
  pid=$(cat "$1" 2>/dev/null) || { echo 0; return; }
  v=$(awk -v f="$2:" '$1 == f {print $2}' "/proc/$pid/status" 2>/dev/null)
  echo "${v:-0}"
}

# Every replica's sdns and named (KiB): "sdns_max sdns_sum named_max named_sum sdns_peak named_peak".
rss() {  # rss DIR
  local dir=$1 i s n sp np smax=0 ssum=0 nmax=0 nsum=0 speak=0 npeak=0
  for ((i = 0; i < REPLICAS; i++)); do
    s=$(rss_kib "$dir/replica-$i/sdns.pid" VmRSS); n=$(rss_kib "$dir/replica-$i/state/named/named.pid" VmRSS)
    sp=$(rss_kib "$dir/replica-$i/sdns.pid" VmHWM); np=$(rss_kib "$dir/replica-$i/state/named/named.pid" VmHWM)
    ssum=$((ssum + s)) nsum=$((nsum + n))
    [ "$s" -gt "$smax" ] && smax=$s; [ "$n" -gt "$nmax" ] && nmax=$n
    [ "$sp" -gt "$speak" ] && speak=$sp; [ "$np" -gt "$npeak" ] && npeak=$np
  done
  echo "$smax $ssum $nmax $nsum $speak $npeak"
}

fds() {  # open descriptors of replica I's sdns and named: "sdns named"
  local dir=$1 i=$2
  echo "$(ls "/proc/$(cat "$dir/replica-$i/sdns.pid" 2>/dev/null)/fd" 2>/dev/null | wc -l) $(ls "/proc/$(cat "$dir/replica-$i/state/named/named.pid" 2>/dev/null)/fd" 2>/dev/null | wc -l)"
}

metric() {  # metric PORT NAME -> the value of sdns_NAME at that metrics port, or -
  local v
  v=$(curl -s --max-time 5 "http://127.0.0.1:$1/metrics" | awk -v m="sdns_$2" 'index($1, m "{") == 1 && !seen {print $2; seen = 1}')
  echo "${v:--}"
}

# dig's query times (ms) of READS random zones' www A at PORT: "p50 p95 max answered".
reads() {  # reads PORT N
  local port=$1 n=$2 r
  local batch=$WORK/reads.txt
  : > "$batch"
  for ((r = 0; r < READS; r++)); do
    echo "@127.0.0.1 -p $port www.$(zone_name $((RANDOM % n + 1))) A +tries=1 +time=5" >> "$batch"
  done
  dig -f "$batch" 2>/dev/null | awk '/Query time:/ {print $4}' | sort -n | awk '{v[NR] = $1} END {
    if (NR == 0) {print "- - - 0"; exit}
    print v[int((NR - 1) * 0.50) + 1], v[int((NR - 1) * 0.95) + 1], v[NR], NR}'
}

# The named restarts of installed signings in replica 0's log from line FROM: "count median_ms".
restarts() {  # restarts DIR FROM
  tail -n +"$2" "$1/replica-0/sdns.log" | grep -o 'restart_ms=[0-9]*' | cut -d= -f2 | sort -n | awk '{v[NR] = $1} END {
    if (NR == 0) {print "0 -"; exit}
    print NR, v[int((NR + 1) / 2)]}'
}

fail() {  # fail N WHAT DIR
  local i
  log "FAILED zones=$1: $2"
  {
    echo "=== zones=$1: $2 ($(date -u +%H:%M:%S))"
    for ((i = 0; i < REPLICAS; i++)); do
      echo "--- replica-$i/sdns.log (last 30 lines)"
      tail -n 30 "$3/replica-$i/sdns.log" 2>/dev/null
    done
  } >> "$OUT/failures.txt"
  echo "{\"zones\": $1, \"failed\": \"$2\"}" >> "$RESULTS"
  if [ -n "$ACTIVE_DIR" ]; then
    "$SDNS" cluster down "${ACTIVE_FLAGS[@]}" --dir "$ACTIVE_DIR" >/dev/null 2>&1
    ACTIVE_DIR=""
  fi
}

run_one() {  # run_one N
  local n=$1 dir=$WORK/z$1 base z i t0 out
  base=$(free_base) || { fail "$n" "no free ports" "$dir"; return 1; }
  local flags=(--replicas "$REPLICAS" --algorithm "$ALG" --bind-dir "$BIND_DIR" --client-port "$base" --peer-port "$((base + 10))"
    --named-port "$((base + 20))" --metrics-port "$((base + 30))" --checkpoint-interval "$CKPT")
  for ((z = 1; z <= n; z++)); do flags+=(--zone "$(zone_name "$z")"); done
  local admin=()
  for ((i = 0; i < REPLICAS; i++)); do admin+=(--admin "127.0.0.1:$((base + 30 + i))" --token "$dir/replica-$i/state/admin.token"); done
  local -A r=([zones]=$n [algorithm]=$ALG [port_base]=$base)

  log "zones=$n: dealing"
  r[load_deal]=$(load1)
  t0=$(now)
  "$SDNS" keygen "${flags[@]}" --out "$dir" > "$OUT/logs/keygen-$n.log" 2>&1 || { fail "$n" "keygen" "$dir"; return 1; }
  r[deal_s]=$(since "$t0")
  r[deal_bytes]=$(du -sb "$dir" | cut -f1)
  r[deal_files]=$(find "$dir" -type f | wc -l)
  r[replica_dir_bytes]=$(du -sb "$dir/replica-0" | cut -f1)

  as_json > "$OUT/partial-$n.json" # what a run stopped midway had measured
  log "zones=$n: start-up (the dealt zones, unsigned)"
  ACTIVE_DIR=$dir ACTIVE_FLAGS=("${flags[@]}")
  r[load_start]=$(load1)
  t0=$(now)
  start_replicas "$dir"
  r[sampled_answer_s]=$(wait_sampled "$base" "$n" "$t0") || { fail "$n" "start-up: the sampled zones do not answer" "$dir"; return 1; }
  out=$(wait_all_answer "$base" "$n" "$t0") || { fail "$n" "start-up: not every zone answers ($out)" "$dir"; return 1; }
  r[all_answer_s]=${out%% *}
  read -r r[sdns_rss_kib] r[sdns_rss_sum_kib] r[named_rss_kib] r[named_rss_sum_kib] r[sdns_hwm_kib] r[named_hwm_kib] <<< "$(rss "$dir")"
  read -r r[sdns_fds] r[named_fds] <<< "$(fds "$dir" 0)"

  local from sample=()
  from=$(($(wc -l < "$dir/replica-0/sdns.log") + 1))
  if [ "$n" -le "$SIGN_ALL" ]; then
    for ((z = 1; z <= n; z++)); do sample+=("$(zone_name "$z")"); done
  else
    sample=("$(zone_name 1)" "$(zone_name $(((n + 1) / 2)))" "$(zone_name "$n")")
  fi
  as_json > "$OUT/partial-$n.json"
  log "zones=$n: signing ${#sample[@]} zones, one ordered sign-zone each, one after another"
  r[signed_zones]=${#sample[@]}
  r[load_sign]=$(load1)
  t0=$(now)
  for z in "${sample[@]}"; do
    "$SDNS" sign-zone "${admin[@]}" --zone "$z" >> "$OUT/logs/sign-$n.log" 2>&1 || { fail "$n" "sign-zone $z" "$dir"; return 1; }
  done
  r[sign_s]=$(since "$t0")
  r[sign_per_zone_s]=$(python3 -c "import sys; print(round(float(sys.argv[1]) / int(sys.argv[2]), 2))" "${r[sign_s]}" "${r[signed_zones]}")
  read -r r[installs] r[install_restart_median_ms] <<< "$(restarts "$dir" "$from")"
  as_json > "$OUT/partial-$n.json"
  log "zones=$n: full sweep"
  read -r r[swept_answers] r[swept_signed] r[sweep_s] <<< "$(sweep "$base" "$n")"

  log "zones=$n: an update, then reads across zones"
  local mid seen=0
  mid=$(zone_name $(((n + 1) / 2)))
  r[load_update]=$(load1)
  t0=$(now)
  printf 'server 127.0.0.1 %s\nzone %s\nupdate add bench.%s 300 TXT "issue 28"\nsend\n' "$((base + 1))" "$mid" "$mid" \
    | nsupdate -t 30 -k "$dir/zones/${mid%.}/tsig.key" > "$OUT/logs/update-$n.log" 2>&1 && r[update_ok]=1 || r[update_ok]=0
  r[update_s]=$(since "$t0")
  for ((i = 0; i < REPLICAS; i++)); do
    dig +tries=2 +time=3 @127.0.0.1 -p "$((base + i))" "bench.$mid" TXT +short 2>/dev/null | grep -q "issue 28" && seen=$((seen + 1))
  done
  r[update_seen_at]=$seen
  read -r r[read_p50_ms] r[read_p95_ms] r[read_max_ms] r[reads_answered] <<< "$(reads "$base" "$n")"
  sleep 2 # the last checkpoint's snapshot is written off the executor
  local p=$((base + 30))
  r[checkpoint_digest_s]=$(metric "$p" checkpoint_digest_seconds)
  r[checkpoint_zones_read]=$(metric "$p" checkpoint_zones_read)
  r[snapshot_bytes]=$(metric "$p" snapshot_bytes)
  r[snapshot_write_s]=$(metric "$p" snapshot_write_seconds)
  r[stable_checkpoint]=$(metric "$p" stable_checkpoint_seq)
  r[state_dir_bytes]=$(du -sb "$dir/replica-0/state" | cut -f1)
  read -r r[after_sdns_rss_kib] _ r[after_named_rss_kib] _ r[after_sdns_hwm_kib] r[after_named_hwm_kib] <<< "$(rss "$dir")"

  as_json > "$OUT/partial-$n.json"
  log "zones=$n: restart"
  "$SDNS" cluster down "${flags[@]}" --dir "$dir" > "$OUT/logs/down-$n.log" 2>&1
  r[load_restart]=$(load1)
  t0=$(now)
  start_replicas "$dir"
  out=$(wait_all_answer "$base" "$n" "$t0") || { fail "$n" "restart: not every zone answers ($out)" "$dir"; return 1; }
  r[restart_all_answer_s]=${out%% *} r[restart_signed]=${out#* }
  read -r r[restart_sdns_rss_kib] _ r[restart_named_rss_kib] _ _ _ <<< "$(rss "$dir")"
  for ((i = 0; i < REPLICAS; i++)); do cp "$dir/replica-$i/sdns.log" "$OUT/logs/replica-$i-$n.log" 2>/dev/null; done
  "$SDNS" cluster down "${flags[@]}" --dir "$dir" >> "$OUT/logs/down-$n.log" 2>&1
  ACTIVE_DIR=""
  [ "${BENCH_KEEP_WORK:-0}" = 1 ] || rm -rf "$dir"

  as_json >> "$RESULTS"
  rm -f "$OUT/partial-$n.json"
  log "zones=$n: done ($(tail -n1 "$RESULTS"))"
}

# run_one's figures so far (bash's dynamic scope: its local r) as one JSON line.
as_json() {
  local k args=()
  for k in "${!r[@]}"; do args+=("$k=${r[$k]}"); done
  python3 -c 'import json, sys
d = {}
for a in sys.argv[1:]:
    k, v = a.split("=", 1)
    for kind in (int, float, str):
        try:
            d[k] = kind(v)
            break
        except ValueError:
            pass
print(json.dumps(d, sort_keys=True))' "${args[@]}"
}

log "output in $OUT; work dir $WORK; $(nproc) cores; $(uptime)"
{
  echo "date: $(date -u +%FT%TZ)"; echo "uptime: $(uptime)"; echo "cpus: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo; echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null)"
  echo "sdns: $SDNS ($(stat -c '%y' "$SDNS" 2>/dev/null))"; echo "ulimit -n: $(ulimit -n)"
  echo "zone counts: $COUNTS; algorithm $ALG; all signed up to $SIGN_ALL zones; reads $READS; checkpoint interval $CKPT"
} > "$OUT/machine.txt"

for n in $COUNTS; do
  run_one "$n"
done

python3 - "$RESULTS" > "$OUT/report.md" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
mib = lambda v: f"{v / 1024:.0f}" if isinstance(v, (int, float)) else str(v)
mb = lambda v: f"{v / 1e6:.2f}" if isinstance(v, (int, float)) else str(v)
cols = [
    ("zones", lambda r: r["zones"]),
    ("deal s", lambda r: r.get("deal_s")),
    ("dealt MB", lambda r: mb(r.get("deal_bytes"))),
    ("start: sampled / all answer s", lambda r: f"{r.get('sampled_answer_s')} / {r.get('all_answer_s')}"),
    ("sdns RSS MiB (peak)", lambda r: f"{mib(r.get('sdns_rss_kib'))} ({mib(r.get('after_sdns_hwm_kib'))})"),
    ("named RSS MiB", lambda r: mib(r.get("named_rss_kib"))),
    ("fds sdns/named", lambda r: f"{r.get('sdns_fds')}/{r.get('named_fds')}"),
    ("signed zones: s each", lambda r: f"{r.get('signed_zones')}: {r.get('sign_per_zone_s')}"),
    ("named restart per install ms", lambda r: r.get("install_restart_median_ms")),
    ("signed SOAs", lambda r: f"{r.get('swept_signed')}/{4 * r['zones']}"),
    ("sweep s", lambda r: r.get("sweep_s")),
    ("update s (seen at)", lambda r: f"{r.get('update_s')} ({r.get('update_seen_at')}/4)"),
    ("reads p50/p95/max ms", lambda r: f"{r.get('read_p50_ms')}/{r.get('read_p95_ms')}/{r.get('read_max_ms')}"),
    ("checkpoint digest s (zones)", lambda r: f"{r.get('checkpoint_digest_s')} ({r.get('checkpoint_zones_read')})"),
    ("snapshot MB (write s)", lambda r: f"{mb(r.get('snapshot_bytes'))} ({r.get('snapshot_write_s')})"),
    ("restart: all answer s", lambda r: r.get("restart_all_answer_s")),
    ("after restart sdns/named MiB", lambda r: f"{mib(r.get('restart_sdns_rss_kib'))}/{mib(r.get('restart_named_rss_kib'))}"),
    ("load start/sign/restart", lambda r: f"{r.get('load_start')}/{r.get('load_sign')}/{r.get('load_restart')}"),
]
print("| " + " | ".join(c for c, _ in cols) + " |")
print("|" + "---|" * len(cols))
for r in rows:
    if "failed" in r:
        print(f"| {r['zones']} | failed: {r['failed']} |" + " |" * (len(cols) - 2))
        continue
    print("| " + " | ".join(str(f(r)) for _, f in cols) + " |")
EOF
log "report: $OUT/report.md"
cat "$OUT/report.md"
