#!/bin/sh
# The one-shot dealer (compose service `dealer`, run as root in the replica image): deals
# the threshold key once with `sdns keygen`, gives each replica's volume only that
# replica's directory, owned by the unprivileged replica user, and copies the operator's
# files (TSIG key, trust anchor, DS) to the operator directory. Keys already dealt are kept.
#
# Mounts: /deal (tmpfs: the full dealing never touches a disk), /deal/replica-<i> (replica
# i's key volume), /operator (a host directory).
set -eu
n=${SDNS_REPLICAS:?}
net=${SDNS_NET:?}
zone=${SDNS_ZONE:-example.test.}
bits=${SDNS_BITS:-2048}
# The zone key's DNSSEC algorithm: 8 (RSASHA256, the default), 10, 13 (ECDSAP256SHA256) or
# 15 (ED25519); README, "Choosing the algorithm".
algorithm=${SDNS_ALGORITHM:-8}
uid=${SDNS_OPERATOR_UID:-0}
gid=${SDNS_OPERATOR_GID:-0}
# The paper's fault injection, for benchmarks and tests: these replicas invert every bit of
# their signature shares (comma-separated ids; empty: none).
corrupt=${SDNS_CORRUPT:-}

dealt=0
i=0
addresses=""
while [ "$i" -lt "$n" ]; do
    [ -d "/deal/replica-$i" ] || { echo "dealer: /deal/replica-$i is not mounted" >&2; exit 1; }
    [ -f "/deal/replica-$i/share.json" ] && dealt=$((dealt + 1))
    addresses="$addresses${addresses:+,}$net.$((10 + i))"
    i=$((i + 1))
done
if [ "$dealt" -eq "$n" ]; then
    echo "dealer: keys for $n replicas already dealt; keeping them"
    exit 0
fi
if [ "$dealt" -ne 0 ]; then
    echo "dealer: only $dealt of $n replicas have keys (an interrupted dealing?): remove the volumes (docker-compose down -v) and deal again" >&2
    exit 1
fi

sdns keygen --zone "$zone" --replicas "$n" --bits "$bits" --algorithm "$algorithm" --addresses "$addresses" \
    --client-port 53 --peer-port 5400 --named-port 5501 --metrics-port 5601 \
    --bind-dir /opt/bind9 ${corrupt:+--corrupt "$corrupt"} --out /deal

i=0
while [ "$i" -lt "$n" ]; do
    d=/deal/replica-$i
    # The key volume is mounted read-only in the replica; runtime state goes to its own volume.
    sed -i 's|^state_dir = .*|state_dir = "/var/lib/sdns"|' "$d/replica.toml"
    grep -q '^state_dir = "/var/lib/sdns"$' "$d/replica.toml" || { echo "dealer: could not set state_dir in $d/replica.toml" >&2; exit 1; }
    chown -R 5353:5353 "$d"
    chmod 0700 "$d"
    i=$((i + 1))
done

for f in /deal/tsig.key /deal/transfer.key /deal/trust-anchor.conf /deal/ds.txt /deal/K*.key /deal/zone.db; do
    cp "$f" /operator/
    chown "$uid:$gid" "/operator/$(basename "$f")"
done
# The update key, and the key zone transfers need (named sees no client addresses).
chmod 0600 /operator/tsig.key /operator/transfer.key
echo "dealer: dealt $n shares (threshold key, TLS, TSIG); operator files in the operator directory"
