#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages the project builds and tests with.
# Idempotent: packages already present are not fetched again.
set -euo pipefail

pkgs=(
  # building the patched named from BIND's source
  build-essential pkg-config libssl-dev libuv1-dev libcap-dev xz-utils dpkg-dev
  # the real DNS tools the tests drive: dig, delv, nsupdate, dnssec-verify, dnssec-dsfromkey
  bind9-dnsutils bind9-utils dnsperf openssl
  # tests/adopt.rs: the operator's stock named (bind9) that signs its zone with dnssec-policy,
  # and validating resolvers (unbound) that trust the old and the new DS through the rollover
  bind9 unbound
  # tests/secondaries.rs: the cluster's external secondaries, Debian's named (bind9) and NSD
  nsd
  # the fault scenarios' skewed clock (tests/faults.rs): LD_PRELOAD libfaketime for one replica
  faketime
  # misc
  ca-certificates curl python3
  # the plots of scripts/bench-table2.sh and scripts/nemesis/fault-plots.sh (tests/nemesis.rs)
  python3-matplotlib
  # the Docker cluster (scripts/docker-cluster.sh): a bookworm base image without a registry
  debootstrap
)
# The Docker engine and compose tool, unless the machine has them (from Debian or elsewhere).
command -v docker >/dev/null 2>&1 || pkgs+=(docker.io)
if ! command -v docker-compose >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1; then
  pkgs+=(docker-compose)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
# bind9, unbound and nsd are installed for their binaries only (the tests run them on their own
# ports): their services must not start and take port 53 from each other or from a BIND
# already there. Where no policy-rc.d exists, one refusing every start is kept for the install.
guard=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  guard=/usr/sbin/policy-rc.d
  printf '#!/bin/sh\n# sdns install-deps: no service starts during this install\nexit 101\n' | $SUDO tee "$guard" >/dev/null
  $SUDO chmod 755 "$guard"
  trap '$SUDO rm -f "$guard"' EXIT
fi
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
