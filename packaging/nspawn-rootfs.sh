#!/usr/bin/env bash
# packaging/nspawn-rootfs.sh: make the Debian root file system that the booted
# tests of packaging/ (nspawn_test.go and the others) boot with systemd-nspawn
# (systemd as PID 1), once per Debian release:
#
#   sudo bash packaging/nspawn-rootfs.sh [--release 12|13] [DIR]
#
# --release 12 (the default) is bookworm, 13 is trixie. DIR defaults to
# /var/cache/espd-nspawn/rootfs for 12 and /var/cache/espd-nspawn/rootfs-13 for
# 13, where the tests look unless ESPD_NSPAWN_ROOTFS (12) or
# ESPD_NSPAWN_ROOTFS_13 (13) says otherwise. It is a minbase debootstrap with
# systemd, nftables and what the espd package depends on. It is made next to
# DIR and renamed into place, so DIR is complete or absent; an existing DIR
# made with the same release and package list is kept (CI caches it between
# runs), one made with another is made again. The
# tests never write to it (systemd-nspawn --volatile=overlay), and neither does
# packaging/build.sh, which builds 13's plugin in a copy of it.
set -euo pipefail

release=12
if [ "${1:-}" = --release ]; then
	release=${2:?--release needs 12 or 13}
	shift 2
fi
case "$release" in
12) suite=bookworm def=/var/cache/espd-nspawn/rootfs ;;
13) suite=trixie def=/var/cache/espd-nspawn/rootfs-13 ;;
*) echo "nspawn-rootfs: unknown release $release (12 or 13)" >&2; exit 1 ;;
esac
dir=${1:-$def}
mirror=${ESPD_NSPAWN_MIRROR:-http://deb.debian.org/debian}
# systemd and dbus for the boot, iproute2 for looking at the container's
# links, procps because the espd package depends on it, nftables for
# docs/deploy.md's firewall (firewall_nspawn_test.go). The stamp names the
# list: a cached DIR made with another one (CI caches it) is made again.
include=systemd,systemd-sysv,dbus,iproute2,procps,nftables
stamp="$suite minbase $include"
# 13 lists its updates and security suites, as an installed Debian does:
# strongSwan's current revision and its source are served from there
# (packaging/build.sh builds 13's plugin in a copy of this root).
[ "$release" = 12 ] || stamp="$stamp +updates +security"

if [ -f "$dir/.espd-nspawn" ] && [ "$(cat "$dir/.espd-nspawn")" = "$stamp" ]; then
	echo "nspawn-rootfs: $dir ($suite) is up to date"
	exit 0
fi
command -v debootstrap >/dev/null || { echo "nspawn-rootfs: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
mkdir -p "$(dirname "$dir")"
tmp=$(mktemp -d "$dir.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
debootstrap --variant=minbase --include="$include" "$suite" "$tmp/rootfs" "$mirror" >"$tmp/log" 2>&1 ||
	{ tail -20 "$tmp/log" >&2; exit 1; }
if [ "$release" != 12 ]; then
	printf 'deb %s %s main\n' "$mirror" "$suite" "$mirror" "$suite-updates" \
		"${mirror%/debian}/debian-security" "$suite-security" >"$tmp/rootfs/etc/apt/sources.list"
fi
echo "$stamp" >"$tmp/rootfs/.espd-nspawn"
rm -rf "$dir"
mv "$tmp/rootfs" "$dir"
echo "nspawn-rootfs: made $dir ($suite)"
