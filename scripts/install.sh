#!/usr/bin/env bash
# Installs sdns beside an existing BIND, in the places an operator expects (FHS):
#
#   PREFIX/bin/sdns                          the sdns binary
#   PREFIX/lib/sdns/bind9/{sbin,bin,lib}     the patched BIND build the replicas run
#   PREFIX/share/doc/sdns/README.md
#   /etc/systemd/system/sdns-replica@.service  one replica and its named (packaging/systemd)
#   /etc/sdns/<replica>/                     a replica's configuration and keys (--replica)
#   /var/lib/sdns/<replica>/                 its state (created by systemd: StateDirectory)
#
# It never writes under /etc/bind, never touches Debian's bind9 package, its named or its
# libraries, and never registers the patched libraries with ldconfig (they have the same
# sonames as Debian's bind9-libs; the unit gives them to the replica alone).
#
# Usage: scripts/install.sh [--prefix /usr/local] [--sdns PATH] [--bind-dir DIR]
#                           [--replica DEALT_DIR]... [--force]
#   --sdns      the binary to install (default: target/release/sdns, else target/debug/sdns)
#   --bind-dir  the patched BIND build (default: $SDNS_BIND_DIR, else target/bind9)
#   --replica   a directory `sdns keygen` / `sdns adopt` wrote for one replica (replica-<i>):
#               copied to /etc/sdns/<its name>, owned by the sdns user, with bind_dir and
#               state_dir pointed at the installed places. Repeatable.
#   --force     replace a replica directory already installed under /etc/sdns
#
# DESTDIR=/some/root stages everything under that root instead (packages, tests): then no
# user is created, no ownership changed and systemd is not asked to reload.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix=/usr/local
sdns_bin=""
bind_dir="${SDNS_BIND_DIR:-$here/target/bind9}"
replicas=()
force=0
destdir="${DESTDIR:-}"

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --sdns) sdns_bin="${2:?--sdns needs a path}"; shift 2 ;;
    --bind-dir) bind_dir="${2:?--bind-dir needs a directory}"; shift 2 ;;
    --replica) replicas+=("${2:?--replica needs a directory}"); shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

case "$prefix" in
  /*) ;;
  *) die "--prefix must be absolute: $prefix" ;;
esac
prefix="${prefix%/}"
# /usr and / belong to Debian's packages (and bind9's files live there).
[ "$prefix" != "/usr" ] && [ -n "$prefix" ] || die "--prefix $prefix is the package manager's; use /usr/local or /opt/sdns"
if [ -n "$destdir" ]; then
  case "$destdir" in
    /*) ;;
    *) die "DESTDIR must be absolute: $destdir" ;;
  esac
  destdir="${destdir%/}"
  [ "$destdir" != "" ] || die "DESTDIR=/ : leave DESTDIR unset to install into the running system"
elif [ "$(id -u)" -ne 0 ]; then
  die "installing into the running system needs root (or set DESTDIR to stage into a directory)"
fi

if [ -z "$sdns_bin" ]; then
  for c in "$here/target/release/sdns" "$here/target/debug/sdns"; do
    [ -x "$c" ] && { sdns_bin="$c"; break; }
  done
fi
[ -n "$sdns_bin" ] && [ -x "$sdns_bin" ] || die "no sdns binary (cargo build --release -p sdns, or --sdns PATH)"
[ -x "$bind_dir/sbin/named" ] || die "no patched named under $bind_dir (patches/bind9/build.sh, or --bind-dir DIR)"

# Every path this script writes, below the (staging) root.
root="$destdir"
bindest="$root$prefix/lib/sdns/bind9"
unitdir="$root/etc/systemd/system"

say "sdns -> $root$prefix/bin/sdns"
install -D -m 0755 "$sdns_bin" "$root$prefix/bin/sdns"

say "patched BIND ($bind_dir) -> $bindest"
rm -rf "$bindest.new"
mkdir -p "$bindest.new"
for d in sbin bin lib; do
  [ -d "$bind_dir/$d" ] || die "$bind_dir has no $d/"
  cp -a "$bind_dir/$d" "$bindest.new/"
done
# libtool archives and pkg-config files are for building against BIND, not for running it.
find "$bindest.new/lib" \( -name '*.la' -o -name pkgconfig \) -prune -exec rm -rf {} +
rm -rf "$bindest"
mv "$bindest.new" "$bindest"

install -d -m 0755 "$root/etc/sdns" "$root/var/lib/sdns" "$root$prefix/share/doc/sdns" "$unitdir"
install -m 0644 "$here/README.md" "$root$prefix/share/doc/sdns/README.md"
sed "s|@PREFIX@|$prefix|g" "$here/packaging/systemd/sdns-replica@.service" >"$unitdir/sdns-replica@.service.new"
chmod 0644 "$unitdir/sdns-replica@.service.new"
mv "$unitdir/sdns-replica@.service.new" "$unitdir/sdns-replica@.service"
say "unit -> $unitdir/sdns-replica@.service"

if [ -z "$destdir" ] && ! getent passwd sdns >/dev/null; then
  say "creating the system user sdns"
  useradd --system --user-group --home-dir /var/lib/sdns --no-create-home --shell /usr/sbin/nologin sdns
fi

for src in "${replicas[@]}"; do
  # One zone: share.json at the top; several: one under zones/<zone>/ each.
  shares=$(find "$src" -maxdepth 3 -name share.json \( -path "$src/share.json" -o -path "$src/zones/*/share.json" \) | head -n 1)
  [ -f "$src/replica.toml" ] && [ -n "$shares" ] || die "$src is not a replica directory from sdns keygen/adopt (no replica.toml or share.json)"
  name="$(basename "$(cd "$src" && pwd)")"
  case "$name" in
    *[!A-Za-z0-9._-]*|.*) die "replica directory name $name: use letters, digits, . _ -" ;;
  esac
  dest="$root/etc/sdns/$name"
  if [ -e "$dest" ]; then
    [ "$force" = 1 ] || die "$dest exists (a replica is installed there); --force replaces it"
    rm -rf "$dest"
  fi
  install -d -m 0700 "$dest"
  # The dealt files only: not a cluster's runtime state, pid or log from `sdns cluster up`.
  for f in "$src"/*; do
    case "$(basename "$f")" in
      state|sdns.pid|sdns.log) continue ;;
    esac
    [ -f "$f" ] || continue
    cp -p "$f" "$dest/"
  done
  # Several zones: each zone's key share, public key, zone file and keys in zones/<zone>/
  # (files only, modes kept; nothing else under zones/ is the dealer's).
  if [ -d "$src/zones" ]; then
    install -d -m 0700 "$dest/zones"
    for z in "$src"/zones/*; do
      [ -d "$z" ] || continue
      zname="$(basename "$z")"
      case "$zname" in
        *[!A-Za-z0-9._-]*|.*) die "zone directory $z: use letters, digits, . _ -" ;;
      esac
      install -d -m 0700 "$dest/zones/$zname"
      for f in "$z"/*; do
        [ -f "$f" ] || continue
        cp -p "$f" "$dest/zones/$zname/"
      done
    done
  fi
  # Secrets stay 0600 (sdns run refuses a key share others can read); the rest 0644.
  sed -i \
    -e "s|^bind_dir = .*|bind_dir = \"$prefix/lib/sdns/bind9\"|" \
    -e "s|^state_dir = .*|state_dir = \"/var/lib/sdns/$name\"|" \
    "$dest/replica.toml"
  grep -q "^state_dir = \"/var/lib/sdns/$name\"" "$dest/replica.toml" || die "$dest/replica.toml: no state_dir line to point at /var/lib/sdns/$name"
  if [ -z "$destdir" ]; then
    chown -R sdns:sdns "$dest"
  fi
  say "replica $name -> $dest (state in /var/lib/sdns/$name)"
done

if [ -z "$destdir" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl daemon-reload
fi

say "done. Nothing under /etc/bind or of the bind9 package was changed."
if [ ${#replicas[@]} -gt 0 ]; then
  for src in "${replicas[@]}"; do
    say "start it: systemctl enable --now sdns-replica@$(basename "$(cd "$src" && pwd)")"
  done
fi
