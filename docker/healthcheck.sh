#!/bin/sh
# Container health: ask this replica a real DNS question (the zone's SOA) on its client
# address. Reads are ordered, so a healthy answer means this replica's listener, the
# ordering with its peers and its named all work.
set -eu
conf=${SDNS_CONFIG:-/etc/sdns/replica.toml}
# replica.toml as `sdns keygen` writes it: the zone in [cluster] (one zone) or the first
# [[zone]] table's name (several zones), our id in [replica], and one [[peer]] block per
# replica with its client address.
set -- $(awk '
    /^\[/ { section = $0 }
    section == "[cluster]" && $1 == "zone" { gsub(/"/, "", $3); zone = $3 }
    section == "[[zone]]" && $1 == "name" && first == "" { gsub(/"/, "", $3); first = $3 }
    section == "[replica]" && $1 == "id" { me = $3 }
    section == "[[peer]]" && $1 == "id" { peer = $3 }
    section == "[[peer]]" && $1 == "client" { gsub(/"/, "", $3); client[peer] = $3 }
    END { if (zone == "") zone = first; addr = client[me]; n = split(addr, hp, ":"); print zone, hp[1], hp[n] }
' "$conf")
[ $# -eq 3 ] || { echo "healthcheck: cannot read zone and client address from $conf" >&2; exit 1; }
answer=$(dig +norec +time=3 +tries=1 +short "@$2" -p "$3" "$1" SOA) || exit 1
[ -n "$answer" ] || { echo "healthcheck: no SOA answer from $2:$3" >&2; exit 1; }
echo "$answer"
