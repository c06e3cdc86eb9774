#!/usr/bin/env bash
# Build the patched BIND 9.18 (named, dig, nsupdate, delv, dnssec-*) into
# <checkout>/target/bind9 (or $SDNS_BIND_DIR).
#
# Source: Debian's upstream tarball bind9_<v>.orig.tar.xz via `apt-get source
# --download-only bind9` (a deb-src entry is added if missing); fallback for
# machines with a network but no Debian mirror: ISC's release tarball. Either
# way the tarball must match patches/bind9/SHA256SUMS.
#
# Idempotent: a stamp holding the tarball, patch and script hashes makes a
# second run a no-op. Works from any cwd, non-interactively (CI=true, no stdin).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
version=9.18.49
out=${SDNS_BIND_DIR:-$root/target/bind9}
cache=$out/cache
src=$out/src
patch_file=$here/0001-remote-signer.patch
isc_url=https://downloads.isc.org/isc/bind9/$version/bind-$version.tar.xz
jobs=${SDNS_BIND_JOBS:-2}

say() { printf 'bind9-build: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# Adding a deb-src entry needs root; without it the ISC fallback remains.
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
    sudo_cmd=(sudo -n)
fi

expected_sha() { # $1 = file name in SHA256SUMS
    awk -v f="$1" '$2 == f { print $1 }' "$here/SHA256SUMS"
}

file_sha() { sha256sum "$1" | awk '{ print $1 }'; }

stamp_value() {
    printf 'tarball=%s patch=%s script=%s\n' \
        "$(expected_sha "bind9_$version.orig.tar.xz")" \
        "$(file_sha "$patch_file")" "$(file_sha "$here/build.sh")"
}

if [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$(stamp_value)" ] \
    && [ -x "$out/sbin/named" ]; then
    say "up to date: $out/sbin/named"
    exit 0
fi

# Adds deb-src stanzas mirroring the system's Debian/Ubuntu deb ones, in a
# separate file, leaving the system's sources untouched.
ensure_deb_src() {
    if apt-get source --print-uris bind9 </dev/null >/dev/null 2>&1; then
        return 0
    fi
    local added=/etc/apt/sources.list.d/sdns-deb-src.sources
    if [ "${#sudo_cmd[@]}" -ne 0 ] && ! sudo -n true 2>/dev/null; then
        say "no deb-src entry and no root (or password-less sudo) to add one"
        return 1
    fi
    say "adding deb-src entries in $added"
    local tmp
    tmp=$(mktemp)
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        [ "$f" = "$added" ] && continue
        # Keep paragraphs of type deb pointing at debian/ubuntu mirrors.
        awk 'BEGIN { RS = ""; ORS = "\n\n" }
             /(^|\n)Types:[^\n]*deb([ \t]|\n|$)/ && /URIs:[^\n]*(debian|ubuntu)/ {
                 sub(/Types:[^\n]*/, "Types: deb-src"); print }' "$f" >>"$tmp"
    done
    local l
    for l in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$l" ] || continue
        awk '$1 == "deb" && /(debian|ubuntu)/ { $1 = "deb-src"; print }' "$l" \
            >>"$tmp.list"
    done
    local ok=0
    if [ -s "$tmp" ]; then
        "${sudo_cmd[@]}" install -m 0644 "$tmp" "$added" || ok=1
    fi
    if [ -s "$tmp.list" ]; then
        "${sudo_cmd[@]}" install -m 0644 "$tmp.list" /etc/apt/sources.list.d/sdns-deb-src.list || ok=1
    fi
    rm -f "$tmp" "$tmp.list"
    [ "$ok" -eq 0 ] || { say "could not write the deb-src entry"; return 1; }
    "${sudo_cmd[@]}" apt-get update -qq </dev/null >/dev/null || { say "apt-get update failed"; return 1; }
}

fetch_tarball() {
    mkdir -p "$cache"
    local deb=$cache/bind9_$version.orig.tar.xz
    local want
    want=$(expected_sha "bind9_$version.orig.tar.xz")
    [ -n "$want" ] || die "no checksum for bind9_$version.orig.tar.xz in SHA256SUMS"
    if [ -f "$deb" ] && [ "$(file_sha "$deb")" = "$want" ]; then
        echo "$deb"; return 0
    fi
    if command -v apt-get >/dev/null; then
        ensure_deb_src || true
        say "fetching bind9 source with apt-get source (into $cache)"
        # The .dsc/.debian.tar.xz of the security suite may 404 and make
        # apt-get exit non-zero; only the upstream tarball matters.
        (cd "$cache" && apt-get source --download-only bind9 </dev/null >"$cache/apt.log" 2>&1) || true
        local got
        got=$(ls "$cache"/bind9_9.18.*.orig.tar.xz 2>/dev/null | head -n1 || true)
        if [ -n "$got" ] && [ "$got" != "$deb" ]; then
            die "apt-get fetched $(basename "$got"), this script pins $version: update version and SHA256SUMS"
        fi
    fi
    if ! [ -f "$deb" ]; then
        say "apt-get gave no tarball; trying $isc_url"
        if command -v curl >/dev/null; then
            curl -fsSL --max-time 300 -o "$deb.part" "$isc_url" </dev/null && mv "$deb.part" "$deb" || true
        elif command -v wget >/dev/null; then
            wget -q -T 60 -O "$deb.part" "$isc_url" </dev/null && mv "$deb.part" "$deb" || true
        fi
        # ISC's tarball is byte-identical to Debian's .orig (same checksum).
    fi
    [ -f "$deb" ] || die "could not fetch the BIND $version source (see $cache/apt.log)"
    local have
    have=$(file_sha "$deb")
    if [ "$have" != "$want" ]; then
        rm -f "$deb"
        die "checksum mismatch for bind9_$version.orig.tar.xz: got $have, want $want"
    fi
    echo "$deb"
}

tarball=$(fetch_tarball)
say "source verified: $tarball"

rm -rf "$src"
mkdir -p "$src"
say "unpacking into $src"
tar -xJf "$tarball" -C "$src" --strip-components=1
say "applying $(basename "$patch_file")"
(cd "$src" && patch -p1 --batch --forward <"$patch_file" >/dev/null)

say "configuring (log: $out/configure.log)"
(cd "$src" && ./configure --prefix="$out" \
    --disable-doh --without-libxml2 --without-json-c --without-lmdb \
    --without-gssapi --without-libidn2 --without-zlib --without-cmocka \
    --with-readline=no </dev/null >"$out/configure.log" 2>&1) \
    || { tail -n 30 "$out/configure.log" >&2; die "configure failed"; }

say "building with make -j$jobs (log: $out/make.log; takes a few minutes)"
(cd "$src" && make -j"$jobs" </dev/null >"$out/make.log" 2>&1) \
    || { grep -n -m 20 -E 'error|Error' "$out/make.log" >&2 || true; die "make failed"; }

say "installing into $out"
(cd "$src" && make install </dev/null >"$out/install.log" 2>&1) \
    || { tail -n 30 "$out/install.log" >&2; die "make install failed"; }

for tool in sbin/named bin/dig bin/nsupdate bin/delv bin/dnssec-signzone \
    bin/dnssec-verify bin/dnssec-keygen bin/named-checkconf; do
    [ -x "$out/$tool" ] || die "missing after install: $out/$tool"
done
stamp_value >"$out/.stamp"
say "done: $out/sbin/named"
