#!/usr/bin/env bash
# cross.sh ARCH: build charon's espd plugin for the Debian architecture ARCH (amd64,
# arm64 or armhf, not this machine's) against that architecture's libcharon and libstrongswan of exactly the
# strongSwan version installed on this machine, with a cross compiler, and stage it as
# build.sh does (ESPD_SS_DESTDIR, required here: a cross-built plugin is never
# installed on this machine).
#
# It runs build.sh first (which fetches and configures the strongSwan source for this
# machine), copies that source to $ESPD_SS_CACHE/cross-ARCH, configures the copy for
# ARCH (--host, the same mediation setting as ARCH's libcharon), and links the plugin
# against ARCH's strongswan-libcharon and libstrongswan packages, fetched with
# apt-get download through a private apt configuration (internal/qemuguest/apt.sh;
# this machine's apt and dpkg architectures are not touched) and unpacked into a
# sysroot. It installs the cross compiler (gcc-TRIPLET, libc6-dev-ARCH-cross) when
# missing. Run as root on Debian.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${ESPD_SS_CACHE:-/var/cache/espd-strongswan}
destdir=${ESPD_SS_DESTDIR:-}
arch=${1:-}
log() { printf 'cross.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

case "$arch" in
amd64) triplet=x86_64-linux-gnu ;;
arm64) triplet=aarch64-linux-gnu ;;
armhf) triplet=arm-linux-gnueabihf ;;
*) die "usage: cross.sh amd64|arm64|armhf" ;;
esac
[ "$arch" != "$(dpkg --print-architecture)" ] || die "$arch is this machine's architecture: use build.sh"
[ -n "$destdir" ] || die "set ESPD_SS_DESTDIR: a plugin for $arch is staged, never installed here"
[ "$(id -u)" = 0 ] || die "run as root"
export DEBIAN_FRONTEND=noninteractive

# The source, fetched and configured for this machine, and the plugin built here
# (staged in a scratch directory: only the source matters).
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
ESPD_SS_DESTDIR=$scratch bash "$here/build.sh"
debver=$(dpkg-query -W -f='${Version}' strongswan-libcharon)
upstream=${debver#*:}
upstream=${upstream%-*}
src="$cache/strongswan-$upstream"
[ -f "$src/config.h" ] || die "build.sh left no configured source in $src"

missing=()
for p in "gcc-$triplet" "libc6-dev-$arch-cross" "binutils-$triplet"; do
	[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
fi

# ARCH's libcharon and libstrongswan, the version installed here, in a sysroot.
work="$cache/cross-$arch"
sysroot="$work/sysroot-$debver"
if [ ! -f "$sysroot/usr/lib/ipsec/libcharon.so" ]; then
	. "$here/../internal/qemuguest/apt.sh"
	rel=$(. /etc/os-release && echo "$VERSION_CODENAME")
	guest_apt "$work" "$rel" "$arch"
	dl="$work/debs"
	rm -rf "$dl" "$sysroot.tmp"
	mkdir -p "$dl" "$sysroot.tmp"
	chown _apt "$dl" 2>/dev/null || true
	(cd "$dl" && apt-get "${aptc[@]}" download -q "strongswan-libcharon:$arch=$debver" "libstrongswan:$arch=$debver" >&2)
	for d in "$dl"/*.deb; do dpkg-deb -x "$d" "$sysroot.tmp"; done
	rm -rf "$dl" "$sysroot"
	mv "$sysroot.tmp" "$sysroot"
fi
[ -f "$sysroot/usr/lib/ipsec/libcharon.so" ] || die "$arch's strongswan-libcharon has no libcharon.so"

# The source configured for ARCH, with mediation as ARCH's libcharon has it.
# (grep -c, not -q: grep -q's early exit would fail nm's pipe under pipefail.)
if "$triplet-nm" -D "$sysroot/usr/lib/ipsec/libcharon.so" | grep -c ' T mediation_manager_create$' >/dev/null; then
	meflag=--enable-mediation want_me=1
else
	meflag=--disable-mediation want_me=0
fi
# The preprocessor flags Debian builds ARCH's packages with (dpkg-buildflags): on
# Debian 13's armhf they make time_t and off_t 64 bits wide, as in its libcharon.
cppflags=$(dpkg-architecture -a "$arch" -c dpkg-buildflags --get CPPFLAGS 2>/dev/null) ||
	die "dpkg-buildflags for $arch failed (dpkg-dev)"
xsrc="$work/strongswan-$upstream"
stamp="$xsrc/.espd-configured"
if [ ! -f "$xsrc/config.h" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$triplet $meflag $cppflags" ]; then
	log "configuring strongSwan $upstream for $arch ($triplet, $meflag; about a minute)"
	rm -rf "$xsrc"
	cp -a "$src" "$xsrc"
	(cd "$xsrc" && make distclean >/dev/null 2>&1 || true
	 ./configure --host="$triplet" CPPFLAGS="$cppflags" --prefix=/usr --sysconfdir=/etc --libdir=/usr/lib \
		--libexecdir=/usr/lib "$meflag" --disable-openssl --disable-gmp >"$work/configure.log" 2>&1) \
		|| die "configure for $arch failed; see $work/configure.log"
	echo "$triplet $meflag $cppflags" >"$stamp"
fi
if grep -Eq '^#define ME( |$)' "$xsrc/config.h"; then have_me=1; else have_me=0; fi
[ "$have_me" = "$want_me" ] || die "config.h for $arch has ME=$have_me but its libcharon needs ME=$want_me"

# Compile and link as build.sh does: every symbol from ARCH's libcharon, libstrongswan
# or libc (-z defs).
ssver=$(sed -n 's/^#define VERSION "\([0-9.]*\)"$/\1/p' "$xsrc/config.h")
IFS=. read -r v_major v_minor v_patch <<<"$ssver"
ssnum=$((v_major * 10000 + v_minor * 100 + ${v_patch:-0}))
so="$work/libstrongswan-espd.so"
log "compiling the plugin for $arch against strongSwan $debver"
# shellcheck disable=SC2086 # $cppflags is a list of flags
"$triplet-gcc" $cppflags -std=gnu11 -O2 -g -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare \
	-Wno-missing-field-initializers -Wno-format -Werror=implicit-function-declaration \
	-fPIC -shared -include "$xsrc/config.h" -DESPD_SS_VERSION="$ssnum" \
	-I"$xsrc/src/libstrongswan" -I"$xsrc/src/libcharon" -I"$here" \
	"$here"/espd_*.c -o "$so.tmp" \
	-L"$sysroot/usr/lib/ipsec" -Wl,-rpath-link,"$sysroot/usr/lib/ipsec" -Wl,-rpath,/usr/lib/ipsec \
	-lcharon -lstrongswan -lpthread -Wl,-z,defs
mv "$so.tmp" "$so"
"$triplet-nm" -D --defined-only "$so" | grep -c ' T espd_plugin_create$' >/dev/null || die "$so lacks espd_plugin_create"

install -d "$destdir/usr/lib/ipsec/plugins" "$destdir/etc/strongswan.d/charon"
install -m 0644 "$so" "$destdir/usr/lib/ipsec/plugins/libstrongswan-espd.so"
install -m 0644 "$here/espd.conf" "$destdir/etc/strongswan.d/charon/espd.conf"
# The strongSwan version the plugin is bound to, for the package's Depends.
echo "$debver" >"$destdir/strongswan-version"
log "staged the $arch plugin in $destdir"
