#!/usr/bin/env bash
# Makes sure a Debian bookworm base image exists for docker/Dockerfile and prints its name.
#
# The configured base ($SDNS_BASE_IMAGE, default debian:bookworm-slim) is used when the
# engine has it or can pull it. Where no registry is reachable, a minimal bookworm root
# file system is built from Debian's packages with debootstrap and imported as
# sdns-base:bookworm (done once; later runs find the image and do nothing).
#
# Progress goes to stderr; stdout carries only the image name.
set -euo pipefail

base=${SDNS_BASE_IMAGE:-debian:bookworm-slim}
local_base=sdns-base:bookworm
mirror=${SDNS_DEBIAN_MIRROR:-http://deb.debian.org/debian}

say() { printf 'docker-base: %s\n' "$*" >&2; }

have() { docker image inspect "$1" >/dev/null 2>&1; }

if have "$base"; then
    echo "$base"; exit 0
fi
if have "$local_base"; then
    say "$base is absent; using the local $local_base"
    echo "$local_base"; exit 0
fi
if timeout 120 docker pull -q "$base" >/dev/null 2>&1 </dev/null; then
    echo "$base"; exit 0
fi

say "$base cannot be pulled; building $local_base from Debian's packages (debootstrap, once)"
if ! command -v debootstrap >/dev/null; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq </dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends debootstrap </dev/null >&2
fi
[ "$(id -u)" -eq 0 ] || { say "debootstrap needs root: run this script as root once, or provide $base"; exit 1; }

work=$(mktemp -d /tmp/sdns-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 </dev/null \
    || { tail -n 20 "$work/debootstrap.log" >&2; say "debootstrap failed"; exit 1; }

# What bookworm-slim leaves out as well: package caches, lists, documentation.
rm -rf "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*.log \
    "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian}/debian-security bookworm-security main
EOF

tar -C "$root" -c . | docker import \
    -c 'CMD ["/bin/bash"]' -c 'ENV LANG=C.UTF-8' \
    -m "minimal Debian bookworm (debootstrap --variant=minbase) for sdns" - "$local_base" >/dev/null
say "built $local_base ($(docker image inspect -f '{{.Size}}' "$local_base" | awk '{ printf "%.0f MB", $1 / 1e6 }'))"
echo "$local_base"
