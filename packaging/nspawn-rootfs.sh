#!/usr/bin/env bash
# packaging/nspawn-rootfs.sh: make the Debian 12 root file system that
# packaging/nspawn_test.go boots with systemd-nspawn (systemd as PID 1), once:
#
#   sudo bash packaging/nspawn-rootfs.sh [DIR]
#
# DIR (default /var/cache/espd-nspawn/rootfs, where the test looks unless
# ESPD_NSPAWN_ROOTFS says otherwise) is a minbase debootstrap of bookworm with
# systemd and what the espd package depends on. It is made next to DIR and
# renamed into place, so DIR is complete or absent; an existing DIR made
# with the same package list is kept (CI caches it between runs). The test
# never writes to it (systemd-nspawn --volatile=overlay).
set -euo pipefail

dir=${1:-/var/cache/espd-nspawn/rootfs}
suite=bookworm
mirror=${ESPD_NSPAWN_MIRROR:-http://deb.debian.org/debian}
# systemd and dbus for the boot, iproute2 for looking at the container's
# links, procps because the espd package depends on it.
include=systemd,systemd-sysv,dbus,iproute2,procps
stamp="$suite minbase $include"

if [ -f "$dir/.espd-nspawn" ] && [ "$(cat "$dir/.espd-nspawn")" = "$stamp" ]; then
	echo "nspawn-rootfs: $dir is up to date"
	exit 0
fi
command -v debootstrap >/dev/null || { echo "nspawn-rootfs: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
mkdir -p "$(dirname "$dir")"
tmp=$(mktemp -d "$dir.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
debootstrap --variant=minbase --include="$include" "$suite" "$tmp/rootfs" "$mirror" >"$tmp/log" 2>&1 ||
	{ tail -20 "$tmp/log" >&2; exit 1; }
echo "$stamp" >"$tmp/rootfs/.espd-nspawn"
rm -rf "$dir"
mv "$tmp/rootfs" "$dir"
echo "nspawn-rootfs: made $dir"
