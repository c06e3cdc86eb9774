#!/usr/bin/env bash
# The sdns cluster in Docker, one replica per container (README.md, "Docker").
#
#   scripts/docker-cluster.sh up [--replicas 7|4]   build what is missing, deal, start, sign, print usage
#   scripts/docker-cluster.sh down                  stop and remove containers, network and volumes (keys too)
#   scripts/docker-cluster.sh build                 only the image (base image, sdns, patched named)
#   scripts/docker-cluster.sh ps | logs [SERVICE]   docker-compose ps / logs of the cluster
#
# From a clean clone: installs the Debian packages, builds the patched named
# (patches/bind9/build.sh) and sdns (cargo) on the host, makes a bookworm base image if
# none can be pulled (scripts/docker-base.sh), builds the replica image, and runs
# docker/compose.yaml (7 replicas) or docker/compose-4.yaml. Every step skips work already done.
#
# Environment (for a second cluster on one engine, as the tests do): SDNS_COMPOSE_PROJECT
# (default sdns), SDNS_NET (a free /24 prefix, default 172.28.53), SDNS_PORT_<i> (host
# ports, default 530(1+i)), SDNS_OPERATOR_DIR (default .docker-cluster), SDNS_BITS (default
# 2048), SDNS_ALGORITHM (the zone key's DNSSEC algorithm: 8, the default, 10, 13 or 15),
# SDNS_PROFILE (cargo profile of the sdns binary: debug or release, default debug),
# SDNS_BIND_DIR (the patched BIND build, default target/bind9), SDNS_PREBUILT=1 (sdns and
# the patched named are built already: only stage them and build the image), SDNS_SKIP_BUILD=1
# (use the image as it is).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

project=${SDNS_COMPOSE_PROJECT:-sdns}
operator=${SDNS_OPERATOR_DIR:-$root/.docker-cluster}
bind_dir=${SDNS_BIND_DIR:-$root/target/bind9}
profile=${SDNS_PROFILE:-debug}
image=${SDNS_IMAGE:-sdns-replica:local}
zone=example.test

say() { printf 'docker-cluster: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

if command -v docker-compose >/dev/null; then
    compose_cmd=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
    compose_cmd=(docker compose)
else
    compose_cmd=()
fi

compose_file() { # $1 = replicas
    case $1 in
        7) echo "$root/docker/compose.yaml" ;;
        4) echo "$root/docker/compose-4.yaml" ;;
        *) die "--replicas must be 7 or 4" ;;
    esac
}

# The replica count of a running cluster is remembered next to the operator's files.
replicas_file=$operator/replicas

compose() { # $1 = replicas, then compose arguments
    local n=$1
    shift
    [ ${#compose_cmd[@]} -gt 0 ] || die "neither docker-compose nor the docker compose plugin is installed"
    SDNS_OPERATOR_DIR=$operator SDNS_IMAGE=$image "${compose_cmd[@]}" -p "$project" -f "$(compose_file "$n")" "$@"
}

host_dig() {
    if command -v dig >/dev/null; then dig "$@"; else "$bind_dir/bin/dig" "$@"; fi
}

stage_and_build() {
    if [ "${SDNS_SKIP_BUILD:-0}" = 1 ]; then
        docker image inspect "$image" >/dev/null 2>&1 || die "SDNS_SKIP_BUILD=1 but there is no image $image"
        return 0
    fi
    command -v docker >/dev/null || die "docker is not installed"
    if [ "${SDNS_PREBUILT:-0}" = 1 ]; then
        # The tests: sdns and the patched named are built already (scripts/test.sh).
        [ -x "$root/target/$profile/sdns" ] || die "SDNS_PREBUILT=1 but no target/$profile/sdns"
        [ -x "$bind_dir/sbin/named" ] || die "SDNS_PREBUILT=1 but no $bind_dir/sbin/named"
    else
        scripts/install-deps.sh >&2
        SDNS_BIND_DIR=$bind_dir patches/bind9/build.sh
        local cargo_flags=()
        [ "$profile" = release ] && cargo_flags=(--release)
        command -v cargo >/dev/null || die "cargo not found; install Rust (https://rustup.rs)"
        cargo build -p sdns --bin sdns "${cargo_flags[@]}" >&2
    fi

    # The build context: only what the image needs, stripped (debug info stays on the host).
    local ctx=$root/target/docker/context
    rm -rf "$ctx"
    mkdir -p "$ctx/bind9/sbin" "$ctx/bind9/bin" "$ctx/bind9/lib"
    install -m 0755 "$root/target/$profile/sdns" "$ctx/sdns"
    install -m 0755 "$root/docker/healthcheck.sh" "$ctx/sdns-healthcheck"
    install -m 0755 "$root/docker/dealer.sh" "$ctx/sdns-dealer"
    # What sdns runs (named-glue's BindTools and zone maintenance) and dig for the health check.
    install -m 0755 "$bind_dir/sbin/named" "$ctx/bind9/sbin/"
    local t
    for t in dig named-checkconf named-compilezone dnssec-signzone; do
        install -m 0755 "$bind_dir/bin/$t" "$ctx/bind9/bin/"
    done
    cp "$bind_dir"/lib/lib*-9.18.*.so "$ctx/bind9/lib/"
    strip --strip-unneeded "$ctx/sdns" "$ctx"/bind9/sbin/* "$ctx"/bind9/bin/* "$ctx"/bind9/lib/*.so

    local base
    base=$(scripts/docker-base.sh)
    say "building $image on $base"
    # The classic builder: no buildx plugin is needed, and its layer cache makes a rebuild
    # with unchanged inputs a no-op.
    DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE_IMAGE=$base" -t "$image" \
        -f "$root/docker/Dockerfile" "$ctx" >/dev/null
    say "image $image: $(docker image inspect -f '{{.Size}}' "$image" | awk '{ printf "%.0f MB", $1 / 1e6 }')"
}

container() { # $1 = replicas, $2 = service
    compose "$1" ps -q "$2"
}

wait_healthy() { # $1 = replicas, $2 = seconds
    local n=$1 deadline=$((SECONDS + $2)) i
    for ((i = 0; i < n; i++)); do
        local id state
        while :; do
            id=$(container "$n" "replica-$i" 2>/dev/null || true)
            state=$( [ -n "$id" ] && docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id" 2>/dev/null || echo absent)
            [ "$state" = healthy ] && break
            if [ $SECONDS -ge $deadline ]; then
                compose "$n" ps >&2 || true
                compose "$n" logs --tail 30 "replica-$i" >&2 || true
                die "replica-$i is $state after $2 s"
            fi
            sleep 2
        done
    done
}

port() { # $1 = replica index
    local v=SDNS_PORT_$1
    echo "${!v:-$((5301 + $1))}"
}

serves_dnskey() { # $1 = replica index
    [ -n "$(host_dig +norec +time=3 +tries=1 +short @127.0.0.1 -p "$(port "$1")" "$zone" DNSKEY 2>/dev/null)" ]
}

up() {
    local n=7
    while [ $# -gt 0 ]; do
        case $1 in
            --replicas) n=${2:?}; shift 2 ;;
            --replicas=*) n=${1#*=}; shift ;;
            *) die "unknown option $1" ;;
        esac
    done
    compose_file "$n" >/dev/null
    if [ -f "$replicas_file" ] && [ "$(cat "$replicas_file")" != "$n" ]; then
        die "a $(cat "$replicas_file")-replica cluster is up ($project); run '$0 down' first"
    fi
    local started=$SECONDS
    stage_and_build
    local built=$SECONDS
    mkdir -p "$operator"
    echo "$n" >"$replicas_file"
    # The dealer runs first (depends_on: service_completed_successfully), then the replicas.
    SDNS_OPERATOR_UID=$(id -u) SDNS_OPERATOR_GID=$(id -g) compose "$n" up -d >&2
    wait_healthy "$n" 240
    if ! serves_dnskey 0; then
        # sign-zone runs once t+1 replicas asked for it: each asks its own replica's admin
        # endpoint (loopback inside its container) with that replica's token.
        local t=$(((n - 1) / 3)) k pids=()
        say "signing the zone with the distributed key (an ordered operation, asked by $((t + 1)) replicas)"
        for ((k = 0; k <= t; k++)); do
            compose "$n" exec -T "replica-$k" sdns sign-zone --admin 127.0.0.1:5601 --token /var/lib/sdns/admin.token >&2 &
            pids+=($!)
        done
        # The replicas whose request was ordered first answer "waiting" (and exit non-zero);
        # whether the signing ran shows below, on every replica.
        for k in "${pids[@]}"; do wait "$k" || true; done
    fi
    local i deadline=$((SECONDS + 120))
    for ((i = 0; i < n; i++)); do
        until serves_dnskey "$i"; do
            [ $SECONDS -lt $deadline ] || die "replica-$i does not serve the signed zone"
            sleep 1
        done
    done
    say "cluster up in $((SECONDS - built)) s (plus $((built - started)) s of building)"
    local op=${operator#"$root"/}
    cat <<EOF

sdns: $n replicas in Docker serving $zone (t = $(((n - 1) / 3))), DNS on 127.0.0.1:$(port 0)..$(port $((n - 1))).

Read through any replica:
  dig @127.0.0.1 -p $(port 0) www.$zone A +dnssec
Validate with the zone's trust anchor:
  delv -a $op/trust-anchor.conf @127.0.0.1 -p $(port 0) www.$zone A +root=$zone
Update through another replica (TSIG):
  printf 'server 127.0.0.1 $(port 1)\nzone $zone\nupdate add new.$zone 300 A 192.0.2.7\nsend\n' | nsupdate -k $op/tsig.key
Health and logs:
  $0 ps
  $0 logs replica-0
Take it down (containers, network and volumes, keys included):
  $0 down
EOF
}

down() {
    local n=7
    [ -f "$replicas_file" ] && n=$(cat "$replicas_file")
    compose "$n" down -v --remove-orphans >&2
    rm -f "$replicas_file" "$operator"/tsig.key "$operator"/trust-anchor.conf "$operator"/ds.txt \
        "$operator"/K*.key "$operator"/zone.db
    rmdir "$operator" 2>/dev/null || true
}

cmd=${1:-up}
[ $# -gt 0 ] && shift
case $cmd in
    up) up "$@" ;;
    down) down ;;
    build) stage_and_build ;;
    ps | logs)
        n=7
        [ -f "$replicas_file" ] && n=$(cat "$replicas_file")
        compose "$n" "$cmd" "$@"
        ;;
    *) die "usage: $0 up [--replicas 7|4] | down | build | ps | logs [SERVICE]" ;;
esac
