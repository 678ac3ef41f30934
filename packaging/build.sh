#!/usr/bin/env bash
# packaging/build.sh: build espd's Debian packages (README.md, "Packages").
#
#   sudo bash packaging/build.sh [-o DIR] [--arch "amd64 arm64 armhf"] [--release "12 13"]
#                                [--no-plugin]
#
# writes to DIR (default dist/ in the checkout):
#
#   espd_VERSION_ARCH.deb             for each ARCH (default amd64, arm64 and armhf):
#                                     /usr/sbin/espd, /usr/bin/espctl, the systemd units of
#                                     packaging/systemd/, an example configuration and the docs;
#                                     static, the same for every Debian release
#   strongswan-espd_VERSION+debREL_ARCH.deb
#                                     for each Debian release REL (default 12 and 13) and
#                                     ARCH: charon's espd plugin, built against that release's
#                                     strongSwan (12: 5.9.8, 13: 6.0.1) of that architecture
#                                     and pinned to that exact version: by strongswan/build.sh
#                                     for this machine's architecture, by strongswan/cross.sh
#                                     (a cross compiler) for another. The release this machine runs
#                                     is built here; another one in a build chroot,
#                                     /var/cache/espd-strongswan-REL/chroot, a copy of the root
#                                     file system packaging/nspawn-rootfs.sh makes for it
#                                     (debootstrap on first use; keep /var/cache/espd-* cached)
#
# espd and espctl are built with GOEXPERIMENT=runtimesecret (docs/reference.md, "Building from a checkout"),
# CGO_ENABLED=0 (static binaries) and -trimpath; armhf is GOARCH=arm GOARM=7. nfpm
# (a pinned release, run through the Go toolchain) makes the packages from the nfpm
# configurations beside this script. Only the plugin needs root: strongswan/build.sh
# installs its build dependencies and fetches strongSwan's source from Debian's registry.
#
# Environment:
#   ESPD_VERSION     package version (default 0.0~gitYYYYMMDDhhmmss.HASH of HEAD's commit)
#   ESPD_MAINTAINER  the packages' Maintainer field
#   ESPD_UNITS_DIR   where the systemd units come from (default packaging/systemd)
set -euo pipefail
umask 022

repo=$(cd "$(dirname "$0")/.." && pwd)
here=$repo/packaging
nfpm_mod=github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.48.0

log() { printf 'packaging: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

out=$repo/dist
arches="amd64 arm64 armhf"
plugin=1
releases="12 13"
while [ $# -gt 0 ]; do
	case "$1" in
	-o) out=$(realpath -m "$2"); shift 2 ;;
	--arch) arches=$2; shift 2 ;;
	--no-plugin) plugin=0; shift ;;
	--release) releases=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument $1 (see --help)" ;;
	esac
done

command -v go >/dev/null || die "needs Go on PATH"
[ "$plugin" = 0 ] || [ "$(id -u)" = 0 ] || die "the plugin package needs root (strongswan/build.sh); --no-plugin skips it"
host_rel=$(. /etc/os-release && echo "${VERSION_ID:-}")
for rel in $releases; do
	case "$rel" in
	12|13) ;;
	*) die "unknown Debian release $rel (12, 13)" ;;
	esac
	if [ "$plugin" = 1 ] && [ "$rel" != "$host_rel" ]; then
		command -v systemd-nspawn >/dev/null || die "the plugin for Debian $rel needs systemd-nspawn (apt-get install systemd-container)"
	fi
done
units_dir=${ESPD_UNITS_DIR:-$here/systemd}
[ -f "$units_dir/espd.service" ] || die "no espd.service in $units_dir: the package ships the systemd units of packaging/systemd"

if [ -z "${ESPD_VERSION:-}" ]; then
	ESPD_VERSION=0.0~git$(TZ=UTC git -C "$repo" log -1 --date=format-local:%Y%m%d%H%M%S --format=%cd HEAD)
	ESPD_VERSION=$ESPD_VERSION.$(git -C "$repo" rev-parse --short=12 HEAD)
fi
export VERSION=$ESPD_VERSION
export MAINTAINER=${ESPD_MAINTAINER:-The espd developers <noreply@espd.invalid>}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
rm -f "$out"/espd_*.deb "$out"/strongswan-espd_*.deb

# nfpm itself, built once for this run (not with espd's GOEXPERIMENT).
log "building nfpm ($nfpm_mod)"
env -u GOEXPERIMENT GOBIN="$work/bin" go install "$nfpm_mod"
nfpm=$work/bin/nfpm

# The units: the unit files of the directory and their drop-ins (NAME.d/*.conf) go
# to /usr/lib/systemd/system; the maintainer scripts stop and purge the units, and
# enable espd.service (not espd-ike.service, its alternative: README.md "Packages")
# and espd-holds.service, which restores the holds at boot for either.
unit_files=$(cd "$units_dir" && find . -mindepth 1 -type f | sed 's|^\./||' \
	| grep -E '^[^/]+\.(service|socket|timer|path|target)$|^[^/]+\.d/[^/]+\.conf$' | sort)
mapfile -t unit_list <<<"$unit_files"
units=$(grep -v / <<<"$unit_files" | tr '\n' ' ')
units=${units% }
# espd.sysusers is packaged too, as /usr/lib/sysusers.d/espd.conf (below).
for f in $(cd "$units_dir" && find . -mindepth 1 -type f | sed 's|^\./||' | grep -vxF "$unit_files" | grep -vxF espd.sysusers); do
	log "not packaged (not a unit or drop-in): $units_dir/$f"
done
# A unit that runs espd or espctl must name the path the package installs.
bad=$(grep -rhoE '^Exec[A-Za-z]*=[-@:+!]*[^ ]*/esp(d|ctl)( |$)' "$units_dir" \
	| sed -E 's/^Exec[A-Za-z]*=[-@:+!]*//; s/ $//' | grep -vxE '/usr/sbin/espd|/usr/bin/espctl' || true)
[ -z "$bad" ] || die "a unit in $units_dir runs $bad; the package installs /usr/sbin/espd and /usr/bin/espctl"

# A unit's User= must exist wherever the package is installed: root, a dynamic
# user, or one that the package's sysusers.d file declares (the postinst creates it).
for f in "${unit_list[@]}"; do
	user=$(sed -n 's/^User=[[:space:]]*//p' "$units_dir/$f" | tail -1)
	if [ -n "$user" ] && [ "$user" != root ] \
		&& ! grep -qiE '^DynamicUser=[[:space:]]*(yes|true|on|1)[[:space:]]*$' "$units_dir/$f" \
		&& ! grep -qE "^u[[:space:]]+$user[[:space:]]" "$units_dir/espd.sysusers" 2>/dev/null; then
		die "$units_dir/$f runs as User=$user, which neither $units_dir/espd.sysusers declares nor DynamicUser=yes makes"
	fi
done

# stage_common DIR: what every espd package holds besides the binaries.
stage_common() {
	local s=$1 f
	mkdir -p "$s/units" "$s/doc/docs" "$s/doc/examples" "$s/scripts"
	(cd "$units_dir" && cp --parents "${unit_list[@]}" "$s/units/")
	cp "$repo/README.md" "$s/doc/"
	cp "$repo"/docs/*.md "$s/doc/docs/"
	cp "$here/espd.toml" "$s/doc/examples/"
	mkdir -p "$s/etc"
	cp "$here/espd-etc.toml" "$s/etc/espd.toml"
	cp "$units_dir/espd.sysusers" "$s/sysusers.conf"
	cp "$repo/LICENSE" "$s/doc/copyright"
	for f in postinst prerm postrm; do
		sed -e "s/@UNITS@/$units/" -e "s/@ENABLE@/espd.service espd-holds.service/" "$here/deb/espd.$f" >"$s/scripts/$f"
	done
}

# build_arch ARCH DIR: espd and espctl for a Debian architecture.
build_arch() {
	local arch=$1 s=$2 goarch goarm="" b info
	case "$arch" in
	amd64|arm64) goarch=$arch ;;
	armhf) goarch=arm goarm=7 ;;
	esac
	# GOWORK=off: from the daemon's go.mod alone, not the workspace that adds bench/.
	for b in espd espctl; do
		(cd "$repo" && GOWORK=off GOEXPERIMENT=runtimesecret CGO_ENABLED=0 GOOS=linux GOARCH=$goarch GOARM=$goarm \
			go build -trimpath -ldflags='-s -w' -o "$s/$b" "./cmd/$b")
		# The build information must say what this script asked for.
		info=$(go version -m "$s/$b")
		grep -qP '^\tbuild\tGOEXPERIMENT=runtimesecret$' <<<"$info" || die "$b ($arch) lacks GOEXPERIMENT=runtimesecret"
		grep -qP "^\tbuild\tGOARCH=$goarch\$" <<<"$info" || die "$b ($arch) is not GOARCH=$goarch"
		[ -z "$goarm" ] || grep -qP "^\tbuild\tGOARM=$goarm\$" <<<"$info" || die "$b ($arch) is not GOARM=$goarm"
	done
}

for arch in $arches; do
	case "$arch" in
	amd64|arm64) export ARCH=$arch ;;
	armhf) export ARCH=arm7 ;; # nfpm's name for 32-bit ARM v7; Debian's armhf
	*) die "unknown architecture $arch (amd64, arm64, armhf)" ;;
	esac
	s=$work/espd-$arch
	mkdir -p "$s"
	log "building espd and espctl for $arch"
	stage_common "$s"
	build_arch "$arch" "$s"
	(cd "$s" && "$nfpm" package --config "$here/espd.yaml" --packager deb --target "$out/") >&2
done

# build_plugin REL ARCH: strongswan-espd_VERSION+debREL_ARCH.deb, charon's plugin for
# Debian REL's strongSwan on ARCH. On this machine's own release strongswan/build.sh
# (this machine's architecture) or strongswan/cross.sh (another) runs here; for another
# release it runs in that release's build chroot (chroot_for), through systemd-nspawn,
# and stages the plugin into this run's directory.
build_plugin() {
	local rel=$1 want=$2 s=$work/strongswan-espd-$rel-$2 root ss_version arch script args
	mkdir -p "$s/root"
	script=build.sh args=()
	if [ "$want" != "$(dpkg --print-architecture)" ]; then
		script=cross.sh args=("$want")
	fi
	if [ "$rel" = "$host_rel" ]; then
		log "building the charon plugin for Debian $rel on $want here (strongswan/$script)"
		ESPD_SS_DESTDIR=$s/root ESPD_SS_CONF=1 bash "$repo/strongswan/$script" "${args[@]}"
		ss_version=$(dpkg-query -W -f='${Version}' strongswan-libcharon)
	else
		# One build at a time per chroot: nspawn refuses a directory in use.
		mkdir -p "$(dirname "${ESPD_BUILD_CHROOT_CACHE:-/var/cache/espd-strongswan}")"
		exec {lockfd}>"${ESPD_BUILD_CHROOT_CACHE:-/var/cache/espd-strongswan}-$rel.lock"
		flock "$lockfd"
		root=$(chroot_for "$rel")
		log "building the charon plugin for Debian $rel on $want in $root (strongswan/$script)"
		in_chroot "$root" --bind-ro="$repo/strongswan:/espd/strongswan" \
			--bind-ro="$repo/internal/qemuguest:/espd/internal/qemuguest" --bind="$s/root:/espd/stage" \
			--setenv=ESPD_SS_DESTDIR=/espd/stage --setenv=ESPD_SS_CONF=1 \
			bash "/espd/strongswan/$script" "${args[@]}"
		ss_version=$(chroot "$root" dpkg-query -W -f='${Version}' strongswan-libcharon)
		exec {lockfd}>&-
	fi
	arch=$want
	if [ "$script" = cross.sh ]; then
		# cross.sh links against ARCH's packages of the version installed where it ran.
		[ "$(cat "$s/root/strongswan-version")" = "$ss_version" ] ||
			die "the $want plugin for Debian $rel was built against $(cat "$s/root/strongswan-version"), not $ss_version"
		rm "$s/root/strongswan-version"
	fi
	# The plugin is bound to the ABI of the strongSwan it was compiled against.
	SS_VERSION=$ss_version ARCH=$arch PLUGIN_VERSION=$VERSION+deb$rel
	export SS_VERSION ARCH PLUGIN_VERSION
	cp "$repo/strongswan/COPYING" "$s/copyright"
	mkdir -p "$s/scripts"
	cp "$here/deb/strongswan-espd.postinst" "$s/scripts/postinst"
	(cd "$s" && "$nfpm" package --config "$here/strongswan-espd.yaml" --packager deb --target "$out/") >&2
}

# in_chroot DIR NSPAWN-ARGS... COMMAND...: run COMMAND in the build chroot DIR
# (not booted; the machine's network, so apt reaches Debian's registry).
in_chroot() {
	local root=$1
	shift
	systemd-nspawn --quiet --register=no --keep-unit --console=pipe --directory="$root" "$@"
}

# chroot_for REL: the build chroot of Debian REL, /var/cache/espd-strongswan-REL/chroot:
# a copy of the root file system that packaging/nspawn-rootfs.sh makes for the booted
# tests (which stays as debootstrap left it), made once and kept; strongswan/build.sh
# installs its packages and caches strongSwan's source in it. A chroot whose root file
# system was made anew is made anew too.
chroot_for() {
	local rel=$1 cache=${ESPD_BUILD_CHROOT_CACHE:-/var/cache/espd-strongswan}-$rel rootfs
	rootfs=$(rootfs_for "$rel")
	bash "$here/nspawn-rootfs.sh" --release "$rel" "$rootfs" >&2
	if [ ! -f "$cache/chroot/.espd-nspawn" ] || ! cmp -s "$rootfs/.espd-nspawn" "$cache/chroot/.espd-nspawn" \
		|| [ "$rootfs/.espd-nspawn" -nt "$cache/chroot/.espd-nspawn" ]; then
		log "making the Debian $rel build chroot $cache/chroot (a copy of $rootfs)"
		mkdir -p "$cache"
		rm -rf "$cache/chroot" "$cache/chroot.tmp"
		cp -a "$rootfs" "$cache/chroot.tmp"
		chroot "$cache/chroot.tmp" apt-get update -qq >&2
		mv "$cache/chroot.tmp" "$cache/chroot"
	fi
	echo "$cache/chroot"
}

# rootfs_for REL: where packaging/nspawn-rootfs.sh puts Debian REL's root file system
# (and where the booted tests look for it).
rootfs_for() {
	case "$1" in
	12) echo "${ESPD_NSPAWN_ROOTFS:-/var/cache/espd-nspawn/rootfs}" ;;
	*) local v=ESPD_NSPAWN_ROOTFS_$1; echo "${!v:-/var/cache/espd-nspawn/rootfs-$1}" ;;
	esac
}

if [ "$plugin" = 1 ]; then
	for rel in $releases; do
		for arch in $arches; do
			build_plugin "$rel" "$arch"
		done
	done
fi

log "packages in $out:"
(cd "$out" && ls -1 ./*.deb) >&2
