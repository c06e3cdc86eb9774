#!/usr/bin/env bash
# Measures the Docker cluster (docs/BENCHMARKS.md, "The Docker cluster"): image sizes, cluster
# start-up time, and read and update latency across containers for (n, corrupted) = (7, 0) and
# (7, 2), each against the same cluster of sdns processes on loopback (`sdns cluster up`, the
# same binary, key size and corrupted replicas) measured in the same run.
#
# Per configuration: REPS reads (one UDP query for www.example.test A through replica 0, timed
# in-process by python3) and REPS updates (`nsupdate -k` through replica 0, wall time including
# nsupdate's own SOA lookup, as in scripts/bench-cluster.sh). Prints a markdown report; the
# ratio (×) is the Docker p50 over the loopback p50.
#
# Environment: BENCH_REPS [30], BENCH_BITS [2048], BENCH_CONFIGS ["0 1,4"] (corrupted ids per
# configuration, "0" meaning none), SDNS_BIND_DIR [target/bind9], SDNS_PREBUILT (see
# docker-cluster.sh). Ports: 127.0.0.1:61301.. (Docker) and 61401.. (loopback), above the
# ephemeral range and the system tests' ports. Builds the image first (docker-cluster.sh build).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
reps=${BENCH_REPS:-30}
bits=${BENCH_BITS:-2048}
configs=${BENCH_CONFIGS:-"0 1,4"}
bind_dir=${SDNS_BIND_DIR:-$root/target/bind9}
work=$(mktemp -d /tmp/sdns-docker-bench.XXXXXX)
export SDNS_COMPOSE_PROJECT=sdnsbench SDNS_NET=172.28.54 SDNS_OPERATOR_DIR=$work/operator SDNS_BITS=$bits
for i in 0 1 2 3 4 5 6; do export "SDNS_PORT_$i=$((61301 + i))"; done
loop_dir=$work/loopback

cleanup() {
    scripts/docker-cluster.sh down >/dev/null 2>&1 || true
    target/debug/sdns cluster down --replicas 7 --dir "$loop_dir" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# reads PORT -> "p50 mean" in ms over $reps UDP queries
reads() {
    python3 - "$1" "$reps" <<'EOF'
import socket, statistics, struct, sys, time
port, reps = int(sys.argv[1]), int(sys.argv[2])
q = struct.pack(">HHHHHH", 0x1234, 0, 1, 0, 0, 0) + b"\x03www\x07example\x04test\x00" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
ms = []
for k in range(reps):
    t = time.perf_counter()
    s.sendto(q, ("127.0.0.1", port))
    data, _ = s.recvfrom(65535)
    ms.append((time.perf_counter() - t) * 1000)
    assert data[:2] == q[:2] and data[3] & 0x0F == 0, "bad answer"
print(f"{statistics.median(ms):.2f} {statistics.mean(ms):.2f}")
EOF
}

# updates PORT KEY TAG -> "p50 mean" in ms over $reps nsupdate adds
updates() {
    local port=$1 key=$2 tag=$3 k ms=()
    for ((k = 0; k < reps; k++)); do
        local t0 t1
        t0=$(date +%s%N)
        printf 'server 127.0.0.1 %s\nzone example.test\nupdate add %s%d.example.test 300 A 192.0.2.%d\nsend\n' \
            "$port" "$tag" "$k" $((k % 250 + 1)) | "$bind_dir/bin/nsupdate" -t 30 -k "$key"
        t1=$(date +%s%N)
        ms+=($(((t1 - t0) / 1000)))
    done
    printf '%s\n' "${ms[@]}" | sort -n | awk '{ v[NR] = $1; s += $1 } END { printf "%.1f %.1f\n", v[int((NR + 1) / 2)] / 1000, s / NR / 1000 }'
}

scripts/docker-cluster.sh build >&2
image_mb=$(docker image inspect -f '{{.Size}}' sdns-replica:local | awk '{ printf "%.0f", $1 / 1e6 }')
base_mb=$(docker image inspect -f '{{.Size}}' sdns-base:bookworm 2>/dev/null | awk '{ printf "%.0f", $1 / 1e6 }')
echo "| image | size |"
echo "| --- | --- |"
echo "| sdns-replica:local | $image_mb MB |"
[ -n "$base_mb" ] && echo "| sdns-base:bookworm (debootstrap minbase) | $base_mb MB |"
echo
echo "| (n, corrupted) | start-up: dealing | start-up: healthy and signed | read p50 / mean, Docker | read p50 / mean, loopback | update p50 / mean, Docker | update p50 / mean, loopback |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for c in $configs; do
    corrupt=$c
    [ "$c" = 0 ] && corrupt=""
    ncorrupt=0
    [ -n "$corrupt" ] && ncorrupt=$(echo "$corrupt" | tr ',' '\n' | wc -l)
    # Docker: start-up from nothing (image built), then probes.
    t0=$(date +%s%N)
    SDNS_CORRUPT=$corrupt SDNS_SKIP_BUILD=1 scripts/docker-cluster.sh up --replicas 7 >/dev/null 2>"$work/up.log" \
        || { tail -20 "$work/up.log" >&2; exit 1; }
    t1=$(date +%s%N)
    dealer=$(scripts/docker-cluster.sh ps -q dealer)
    deal_s=$(docker inspect -f '{{.State.StartedAt}} {{.State.FinishedAt}}' "$dealer" \
        | python3 -c 'import sys,datetime as d; a,b=sys.stdin.read().split(); f=lambda s: d.datetime.fromisoformat(s[:26].rstrip("Z")); print(f"{(f(b)-f(a)).total_seconds():.0f}")')
    total_s=$(((t1 - t0) / 1000000000))
    sleep 3
    dr=$(reads 61301)
    du=$(updates 61301 "$SDNS_OPERATOR_DIR/tsig.key" d)
    scripts/docker-cluster.sh down >/dev/null 2>&1
    # Loopback, same binary and parameters.
    rm -rf "$loop_dir"
    target/debug/sdns cluster up --replicas 7 --bits "$bits" --dir "$loop_dir" --bind-dir "$bind_dir" \
        --client-port 61401 --peer-port 61501 --named-port 61601 --metrics-port 61701 \
        ${corrupt:+--corrupt "$corrupt"} >/dev/null 2>"$work/loop.log" || { tail -20 "$work/loop.log" >&2; exit 1; }
    sleep 3
    lr=$(reads 61401)
    lu=$(updates 61401 "$loop_dir/tsig.key" l)
    target/debug/sdns cluster down --replicas 7 --dir "$loop_dir" >/dev/null 2>&1
    ratio() { awk -v a="${1%% *}" -v b="${2%% *}" 'BEGIN { printf "%.2f", a / b }'; }
    echo "| (7, $ncorrupt) | $deal_s s | $((total_s - deal_s)) s (total $total_s s) | ${dr/ / \/ } ms (×$(ratio "$dr" "$lr")) | ${lr/ / \/ } ms | ${du/ / \/ } ms (×$(ratio "$du" "$lu")) | ${lu/ / \/ } ms |"
done
