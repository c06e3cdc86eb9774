#!/usr/bin/env bash
# The paper's Table 2 (Cachin & Samar, DSN 2004, Section 5) over emulated wide-area links:
# read, add and delete latency for (n, corrupted) = (1,0), (4,0), (4,1), (7,0), (7,1), (7,2) under
# BASIC, OPT-PROOF and OPT-TE, each beside the latency model (docs/LATENCY.md), the paper's figure
# and a stock named measured in the same run over the same client link. One command:
#
#   SDNS_BIND_DIR=/path/to/patched/bind9 scripts/bench-table2.sh        (TABLE2_QUICK=1: a short run)
#
# Links: this kernel has no netem, so every replica-to-replica link and the client's link go
# through `netdelay` (crates/netdelay), a user-space proxy that delays each direction by the
# one-way delay of scripts/bench/topology.toml. Replica i dials replica j at proxy (i, j)
# (`sdns cluster up --peer-routes`); the client (scripts/bench/measure.py: a UDP query, nsupdate)
# talks to replica 0 through a proxy with the client's delay; the stock named behind the same.
#
# For each configuration: keys dealt once per n (kept in BENCH_KEYS, shared with
# scripts/bench-cluster.sh), proxies started, `cluster up` (the zone is signed over the delayed
# links), REPS reads, adds and deletes through the client proxy, replica 0's metrics before
# and after (ordering and signing time, a signature's time split by phase: Table 3), cluster
# and proxies stopped.
#
# Output: TABLE2_OUT (results.jsonl, report.md, logs, plots); with TABLE2_DOC=1 (the default for a
# full run) a dated section in docs/BENCHMARKS.md ("Table 2 over emulated wide-area links") and
# the PNGs in docs/plots/. Exits 2 if a configuration failed (the others still run).
#
# Environment (defaults in brackets):
#   TABLE2_QUICK [0]        1: configs "1:0 4:0 4:1", protocols "opt-proof opt-te", 5 reps, no doc
#   TABLE2_REPS [20]        repetitions of each of read, add, delete per configuration
#   TABLE2_CONFIGS ["1:0 4:0 4:1 7:0 7:1 7:2"]  TABLE2_PROTOCOLS ["basic opt-proof opt-te"]
#                           (n = 1 runs opt-te only: one replica has no shares to prove)
#   TABLE2_TOPOLOGY [scripts/bench/topology.toml]   TABLE2_SEED [1] (the proxies' jitter/loss)
#   TABLE2_MIN_REQUEST_TIMEOUT_MS [2000]  `cluster up --min-request-timeout-ms` (see below)
#   TABLE2_LOCAL [1]        before each configuration, the same with every delay 0 (through the
#                           same proxies): sdns's own local costs, for the "model+local" column
#   TABLE2_DOC [1, 0 when quick]   TABLE2_OUT [target/bench-table2/<UTC time>]
#   TABLE2_PORT_BASE [23000]  TABLE2_BITS [2048]  TABLE2_SETTLE_SECONDS [3]
#   BENCH_KEYS [target/bench-keys]  SDNS_BIN [<cargo target>/release/sdns]
#   NETDELAY_BIN [<cargo target>/release/netdelay]  SDNS_BIND_DIR [target/bind9]
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE=$ROOT/scripts/bench
ZONE=example.test
QUICK=${TABLE2_QUICK:-0}
if [ "$QUICK" = 1 ]; then
  REPS=${TABLE2_REPS:-5}
  CONFIGS=${TABLE2_CONFIGS:-"1:0 4:0 4:1"}
  PROTOCOLS=${TABLE2_PROTOCOLS:-"opt-proof opt-te"}
  DOC=${TABLE2_DOC:-0}
else
  REPS=${TABLE2_REPS:-20}
  CONFIGS=${TABLE2_CONFIGS:-"1:0 4:0 4:1 7:0 7:1 7:2"}
  PROTOCOLS=${TABLE2_PROTOCOLS:-"basic opt-proof opt-te"}
  DOC=${TABLE2_DOC:-1}
fi
TOPOLOGY=${TABLE2_TOPOLOGY:-$HERE/topology.toml}
SEED=${TABLE2_SEED:-1}
LOCAL=${TABLE2_LOCAL:-1}
# A backup suspects the primary when a request it knows waits longer than this at first (the
# default 250 ms is below a wide-area ordering's first requests: replicas then started view
# changes alone during start-up and stayed in them; docs/LATENCY.md).
MIN_REQUEST_TIMEOUT=${TABLE2_MIN_REQUEST_TIMEOUT_MS:-2000}
BITS=${TABLE2_BITS:-2048}
SETTLE=${TABLE2_SETTLE_SECONDS:-3}
# Below the kernel's ephemeral range (32768-60999 here): an outgoing connection's port must
# not take a proxy's or a replica's listening port.
PORT_BASE=${TABLE2_PORT_BASE:-23000}
KEYS=${BENCH_KEYS:-$ROOT/target/bench-keys}
STAMP=$(date -u +%Y%m%dT%H%MZ)
OUT=${TABLE2_OUT:-$ROOT/target/bench-table2/$STAMP}
BIND_DIR=${SDNS_BIND_DIR:-$ROOT/target/bind9}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
SDNS=${SDNS_BIN:-$TARGET/release/sdns}
NETDELAY=${NETDELAY_BIN:-$TARGET/release/netdelay}
KEYGEN_TIMEOUT=900 UP_TIMEOUT=${TABLE2_UP_TIMEOUT:-300} MEASURE_TIMEOUT=${TABLE2_MEASURE_TIMEOUT:-900}

START=$(date +%s)
WORK=$(mktemp -d /tmp/sdns-table2.XXXXXX)
RESULTS=$OUT/results.jsonl
mkdir -p "$OUT/logs" "$KEYS"
: > "$RESULTS"
FAILED=0

log() { echo "[table2 $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)] $*" >&2; }

ACTIVE_DIR="" ACTIVE_N="" BASE_PID="" PROXY_PID=""
stop_pid() {  # stop_pid PID: TERM, then KILL after 5 s
  local pid=$1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill "$pid" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null
}
cleanup() {
  [ -n "$ACTIVE_DIR" ] && "$SDNS" cluster down --replicas "$ACTIVE_N" --dir "$ACTIVE_DIR" >/dev/null 2>&1
  ACTIVE_DIR=""
  stop_pid "$PROXY_PID"; PROXY_PID=""
  stop_pid "$BASE_PID"; BASE_PID=""
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

meta() {  # meta KEY=VALUE ... -> JSON object (numbers stay numbers)
  python3 -c 'import json,sys
d={}
for a in sys.argv[1:]:
    k,v=a.split("=",1)
    d[k]=int(v) if v.lstrip("-").isdigit() else v
d["load1"]=float(open("/proc/loadavg").read().split()[0])
print(json.dumps(d))' "$@"
}

fail() {  # fail TAG WHAT
  log "FAILED $1: $2"
  FAILED=1
  python3 -c 'import json,sys; print(json.dumps({"tag": sys.argv[1], "failed": sys.argv[2]}))' "$1" "$2" >> "$RESULTS"
}

# --- prerequisites ---------------------------------------------------------------------------
for tool in python3 nsupdate dig curl timeout; do
  command -v "$tool" >/dev/null || { echo "table2: $tool not found" >&2; exit 1; }
done
[ -x "$BIND_DIR/sbin/named" ] || { echo "table2: no patched named in $BIND_DIR (patches/bind9/build.sh)" >&2; exit 1; }
if [ ! -x "$SDNS" ] || [ ! -x "$NETDELAY" ]; then
  log "building sdns and netdelay (release)"
  (cd "$ROOT" && cargo build --release -p sdns --bin sdns -p netdelay --bin netdelay) || { echo "table2: build failed" >&2; exit 1; }
fi
# The plots need matplotlib; Debian's python3-matplotlib is seen by /usr/bin/python3 only (a
# pyenv or venv python3 earlier on PATH does not see it).
REPORT_PY=python3
for py in python3 /usr/bin/python3; do
  if "$py" -c 'import matplotlib, tomllib' 2>/dev/null; then REPORT_PY=$py; break; fi
done
"$REPORT_PY" -c 'import matplotlib' 2>/dev/null || log "python3-matplotlib missing: no plots (apt-get install -y python3-matplotlib)"

log "output in $OUT; $(nproc) cores; $(uptime)"
{
  echo "date: $(date -u +%FT%TZ)"; echo "uptime: $(uptime)"; echo "cpus: $(nproc)"
  echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null)"
  echo "sdns: $SDNS; netdelay: $NETDELAY"
  echo "reps=$REPS bits=$BITS configs=\"$CONFIGS\" protocols=\"$PROTOCOLS\" topology=$TOPOLOGY seed=$SEED"
} > "$OUT/machine.txt"

# --- keys, once per n --------------------------------------------------------------------------
deal() {
  local n=$1 dir=$KEYS/n$1-$BITS
  if [ ! -f "$dir/replica-0/share.json" ]; then
    log "dealing keys for n=$n ($BITS bits)"
    rm -rf "$dir"
    timeout "$KEYGEN_TIMEOUT" "$SDNS" keygen --replicas "$n" --bits "$BITS" --zone "$ZONE" \
      --bind-dir "$BIND_DIR" --out "$dir" > "$OUT/logs/keygen-n$n.log" 2>&1 || { rm -rf "$dir"; return 1; }
  fi
  echo "$dir"
}

# --- proxies -----------------------------------------------------------------------------------
start_proxies() {  # start_proxies LINKS_FILE LOG
  "$NETDELAY" --seed "$SEED" "$1" > "$2" 2>&1 &
  PROXY_PID=$!
  for _ in $(seq 100); do
    grep -q "^netdelay: ready" "$2" 2>/dev/null && return 0
    kill -0 "$PROXY_PID" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# --- stock named, behind the client's link ----------------------------------------------------
BASE_NAMED=$((PORT_BASE + 90)) BASE_PROXY=$((PORT_BASE + 80))
start_baseline() {
  local dealt=$1 b=$WORK/baseline
  mkdir -p "$b/keys"
  cp "$dealt/zone.db" "$b/zone.db"; cp "$dealt/tsig.key" "$b/tsig.key"
  local key keyname
  key=$("$BIND_DIR/bin/dnssec-keygen" -q -K "$b/keys" -f KSK -a RSASHA256 -b "$BITS" -n ZONE "$ZONE") || return 1
  cat "$b/keys/$key.key" >> "$b/zone.db"
  "$BIND_DIR/bin/dnssec-signzone" -q -z -d "$b" -K "$b/keys" -o "$ZONE" -f "$b/zone.signed" "$b/zone.db" \
    "$b/keys/$key" > "$b/signzone.log" 2>&1 || return 1
  keyname=$(sed -n 's/^key "\([^"]*\)".*/\1/p' "$b/tsig.key")
  # The options sdns gives its named (as scripts/bench-cluster.sh's baseline).
  cat > "$b/named.conf" <<EOF
include "$b/tsig.key";
options {
	directory "$b"; pid-file "$b/named.pid"; session-keyfile "$b/session.key";
	listen-on port $BASE_NAMED { 127.0.0.1; }; listen-on-v6 { none; };
	recursion no; dnssec-validation no; notify no; answer-cookie no;
	rrset-order { order none; }; version none;
};
controls { };
zone "$ZONE" {
	type primary; file "$b/zone.signed"; journal "$b/zone.signed.jnl"; key-directory "$b/keys";
	sig-validity-interval 30 30; dnssec-update-mode no-resign; serial-update-method increment;
	update-policy { grant "$keyname" zonesub ANY; };
};
EOF
  env -u SDNS_SIGNER_SOCKET "$BIND_DIR/sbin/named" -g -4 -n 2 -c "$b/named.conf" > "$OUT/logs/baseline-named.log" 2>&1 &
  BASE_PID=$!
  for _ in $(seq 100); do
    dig +tries=1 +time=1 @127.0.0.1 -p "$BASE_NAMED" "$ZONE" SOA +dnssec 2>/dev/null | grep -q RRSIG && return 0
    kill -0 "$BASE_PID" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}

measure_baseline() {  # measure_baseline TAG: through a proxy with the client's delay
  local links=$WORK/baseline-links
  python3 "$HERE/wan.py" links --topology "$TOPOLOGY" --n 1 --peer-port 1 --client-port 1 --named-port "$BASE_NAMED" \
    --proxy-port $((BASE_PROXY - 1)) --links-out "$links.all" --routes-out /dev/null || return 1
  grep "stock named" "$links.all" > "$links"
  start_proxies "$links" "$OUT/logs/$1.netdelay.log" || { fail "$1" "proxies did not start"; return; }
  local out
  out=$(timeout "$MEASURE_TIMEOUT" python3 "$HERE/measure.py" latency --port "$BASE_PROXY" --zone "$ZONE" \
    --key "$WORK/baseline/tsig.key" --reps "$REPS" --tag "$1" --meta "$(meta kind=baseline n=1 corrupted=0 protocol=plain-named)")
  stop_pid "$PROXY_PID"; PROXY_PID=""
  if [ -n "$out" ]; then echo "$out" >> "$RESULTS"; log "$1: $(summ "$out")"; else fail "$1" "baseline measurement failed"; fi
}

summ() {
  python3 -c 'import json,sys
r=json.loads(sys.argv[1]); f=lambda k: "%s %.1f ms" % (k, r[k].get("median_ms",float("nan")))
print(", ".join(f(k) for k in ("read","add","delete")) + ", errors %d" % r["errors"])' "$1"
}

split_json() {  # split_json BEFORE AFTER META_JSON -> META_JSON with the means between two scrapes
  python3 - "$@" <<'PY'
import json, re, sys
def scrape(path):
    # sdns_ordering_latency_seconds, sdns_signing_latency_seconds and the signature's split
    # sdns_signing_phase_seconds{phase=...}: sums and counts.
    v = {}
    for line in open(path, errors="replace"):
        m = re.match(r"sdns_(ordering_latency|signing_latency|signing_phase)_seconds_(sum|count)(?:\{([^}]*)\})? ([0-9.eE+-]+)$", line.strip())
        if m:
            phase = re.search(r'phase="([a-z]+)"', m.group(3) or "")
            name = {"ordering_latency": "ordering", "signing_latency": "signing"}.get(m.group(1)) or (phase and "phase_" + phase.group(1))
            v[(name, m.group(2))] = float(m.group(4))
    return v
a, b, meta = scrape(sys.argv[1]), scrape(sys.argv[2]), json.loads(sys.argv[3])
diff = lambda name, what: b.get((name, what), 0) - a.get((name, what), 0)
for name in ("ordering", "signing"):
    count = diff(name, "count")
    meta[f"{name}_count"] = int(count)
    meta[f"{name}_mean_ms"] = diff(name, "sum") / count * 1000 if count else None
# Table 3: each phase's mean over the signatures of the run (the phases of one signature add
# up to its signing time; absent from replicas without the split).
for phase in ("share", "wait", "combine", "other"):
    count = diff("phase_" + phase, "count")
    meta[f"sig_{phase}_mean_ms"] = diff("phase_" + phase, "sum") / count * 1000 if count else None
print(json.dumps(meta))
PY
}

# --- one configuration --------------------------------------------------------------------------
RUN=0
run_config() {  # run_config N CORRUPTED PROTOCOL [SCALE]: SCALE 0 = every delay 0 (local costs)
  local n=$1 k=$2 proto=$3 scale=${4:-1} tag="n$1c$2-$3" dealt corrupt="" kind=sdns split=split
  [ "$scale" = 0 ] && tag=$tag-local kind=sdns-local split=split-local
  dealt=$(deal "$n") || { fail "$tag" "keygen for n=$n failed"; return; }
  [ "$k" -ge 1 ] && corrupt=$(seq -s, 1 "$k")
  RUN=$((RUN + 1))
  local base=$((PORT_BASE + 100 * RUN))
  [ $((base + 100)) -le 32768 ] || { fail "$tag" "out of ports below 32768 (lower TABLE2_PORT_BASE)"; return; }
  local client=$base peer=$((base + 10)) named=$((base + 20)) metrics=$((base + 30)) proxy=$((base + 40))
  local dir=$WORK/$tag
  rm -rf "$dir"; cp -a "$dealt" "$dir"
  python3 "$HERE/wan.py" links --topology "$TOPOLOGY" --n "$n" --peer-port "$peer" --client-port "$client" \
    --named-port "$BASE_NAMED" --proxy-port "$proxy" --scale "$scale" --links-out "$dir/links" --routes-out "$dir/routes" \
    || { fail "$tag" "no links for n=$n in $TOPOLOGY"; return; }
  cp "$dir/links" "$OUT/logs/$tag.links"
  log "== $tag: n=$n corrupted=${corrupt:-none} protocol=$proto (client proxy $proxy -> $client)"
  start_proxies "$dir/links" "$OUT/logs/$tag.netdelay.log" || { fail "$tag" "proxies did not start"; return; }
  ACTIVE_DIR=$dir ACTIVE_N=$n
  local t0=$SECONDS
  if ! timeout "$UP_TIMEOUT" "$SDNS" cluster up --replicas "$n" --dir "$dir" --bits "$BITS" --zone "$ZONE" \
      --bind-dir "$BIND_DIR" --protocol "$proto" ${corrupt:+--corrupt "$corrupt"} --peer-routes "$dir/routes" \
      --min-request-timeout-ms "$MIN_REQUEST_TIMEOUT" \
      --client-port "$client" --peer-port "$peer" --named-port "$named" --metrics-port "$metrics" > "$OUT/logs/$tag.up.log" 2>&1; then
    fail "$tag" "cluster up failed or timed out: $(tail -n 2 "$OUT/logs/$tag.up.log" | tr '\n' ' ')"
  else
    log "$tag: up in $((SECONDS - t0)) s"
    sleep "$SETTLE"
    curl -s -m 3 "http://127.0.0.1:$metrics/metrics" > "$OUT/logs/$tag.metrics-before.txt"
    local out
    out=$(timeout "$MEASURE_TIMEOUT" python3 "$HERE/measure.py" latency --port "$proxy" --zone "$ZONE" \
      --key "$dir/tsig.key" --reps "$REPS" --tag "$tag" --update-timeout 30 \
      --meta "$(meta kind=$kind n="$n" corrupted="$k" protocol="$proto" corrupt_ids="${corrupt:-}" scale="$scale")")
    curl -s -m 3 "http://127.0.0.1:$metrics/metrics" > "$OUT/logs/$tag.metrics-after.txt"
    if [ -z "$out" ]; then
      fail "$tag" "latency probe failed or timed out"
    else
      echo "$out" >> "$RESULTS"
      log "$tag: $(summ "$out")"
      python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["errors"] else 1)' "$out" \
        && fail "$tag" "some operations failed: $(python3 -c 'import json,sys; print(" | ".join(json.loads(sys.argv[1])["error_messages"][:2]))' "$out")"
      split_json "$OUT/logs/$tag.metrics-before.txt" "$OUT/logs/$tag.metrics-after.txt" \
        "$(meta kind=$split tag="$tag" n="$n" corrupted="$k" protocol="$proto" corrupt_ids="${corrupt:-}")" >> "$RESULTS"
    fi
  fi
  for ((i = 0; i < n; i++)); do cp "$dir/replica-$i/sdns.log" "$OUT/logs/$tag.replica-$i.log" 2>/dev/null; done
  "$SDNS" cluster down --replicas "$n" --dir "$dir" >/dev/null 2>&1
  ACTIVE_DIR=""
  stop_pid "$PROXY_PID"; PROXY_PID=""
  rm -rf "$dir"
}

# --- main ----------------------------------------------------------------------------------------
if dealt1=$(deal 1) && start_baseline "$dealt1"; then
  measure_baseline base-before
else
  fail baseline "stock named did not start (logs/baseline-named.log)"
fi
for cfg in $CONFIGS; do
  n=${cfg%%:*} k=${cfg##*:}
  protos=$PROTOCOLS
  [ "$n" = 1 ] && protos=opt-te
  for proto in $protos; do
    [ "$LOCAL" = 1 ] && run_config "$n" "$k" "$proto" 0
    run_config "$n" "$k" "$proto"
  done
done
[ -n "$BASE_PID" ] && measure_baseline base-after

DATE=$(date -u +%F)
"$REPORT_PY" "$HERE/wan.py" report "$RESULTS" --topology "$TOPOLOGY" --plots "$OUT/plots" --date "$DATE" > "$OUT/report.md"
cat "$OUT/report.md"
if [ "$DOC" = 1 ]; then
  mkdir -p "$ROOT/docs/plots"
  cp "$OUT"/plots/table2-*.png "$ROOT/docs/plots/" 2>/dev/null
  python3 - "$ROOT/docs/BENCHMARKS.md" "$OUT/report.md" "$OUT/machine.txt" "$DATE" "$QUICK" "$REPS" <<'PY'
import sys
doc, report, machine, date, quick, reps = sys.argv[1:7]
text = open(doc).read()
marker = "<!-- table2-runs: scripts/bench-table2.sh inserts each run below this line -->"
if marker not in text:
    sys.exit("table2: docs/BENCHMARKS.md has no table2-runs marker; report left in " + report)
m = open(machine).read().strip()
load = next((l for l in m.splitlines() if l.startswith("uptime")), "")
section = (f"\n### Run of {date} ({'quick: ' if quick == '1' else ''}{reps} repetitions)\n\n"
           "Written by scripts/bench-table2.sh. The machine was shared and loaded while it ran "
           f"({load.strip()}); these are not quiet figures.\n\n```\n{m}\n```\n\n"
           + open(report).read().strip() + "\n")
open(doc, "w").write(text.replace(marker, marker + "\n" + section, 1))
PY
  log "docs/BENCHMARKS.md and docs/plots/ updated"
fi
log "done in $(( $(date +%s) - START )) s; $RESULTS; $OUT/report.md"
[ "$FAILED" = 0 ] || exit 2
