#!/usr/bin/env bash
# build.sh: build and install charon's espd plugin (libstrongswan-espd.so) against the
# strongSwan that Debian installed on this machine.
#
# Debian ships no strongSwan headers, so this script fetches the source package of the
# installed version from Debian's package registry (a deb-src entry for the configured
# mirrors, then `apt-get source --download-only`), configures it with the options that
# shape charon's ABI the way Debian's build does (--enable-mediation defines ME, which
# changes daemon_t and ike_sa_t), compiles the plugin against it and installs:
#
#   /usr/lib/ipsec/plugins/libstrongswan-espd.so
#   /etc/strongswan.d/charon/espd.conf      (only if absent; a changed copy is kept)
#
# It is idempotent: the source and its configured tree are cached in $ESPD_SS_CACHE
# (default /var/cache/espd-strongswan) and reused; the plugin is rebuilt when its
# sources change. Run as root on Debian 12; it installs its own apt dependencies.
#
# Environment:
#   ESPD_SS_CACHE   cache directory (default /var/cache/espd-strongswan)
#   ESPD_SS_NO_APT  1: install no packages (they must be there already)
#   ESPD_SS_DESTDIR prefix for the installed files (default: none, the live system)
#   ESPD_SS_CONF    1: also overwrite an existing espd.conf snippet
#   ESPD_SS_TESTS   1: also install what strongswan/test runs (strongswan-charon,
#                   which brings the ipsec starter's charon: not on a gateway)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${ESPD_SS_CACHE:-/var/cache/espd-strongswan}
destdir=${ESPD_SS_DESTDIR:-}
plugindir=/usr/lib/ipsec/plugins
confdir=/etc/strongswan.d/charon

log() { printf 'build.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and the plugin)"
command -v dpkg-query >/dev/null || die "not a Debian system (no dpkg-query)"

export DEBIAN_FRONTEND=noninteractive

# 1. Packages: the libcharon to build against; charon-systemd, whose strongswan.service
#    is the charon that loads the plugin and swanctl.conf (docs/strongswan.md,
#    "Install"); swanctl and the crypto plugins the proposals need; and the toolchain.
#    Not strongswan-charon: it depends on strongswan-starter, whose
#    strongswan-starter.service starts a second charon (ipsec.conf, never
#    swanctl.conf) on UDP 500 and 4500. strongswan/test runs that stand-alone charon
#    (/usr/lib/ipsec/charon) and kernel-libipsec: ESPD_SS_TESTS=1 installs them too,
#    on a test machine. Only missing packages are installed.
deps=(strongswan-libcharon charon-systemd strongswan-swanctl libstrongswan-standard-plugins
      libgmp-dev build-essential pkg-config dpkg-dev bzip2 xz-utils ca-certificates)
if [ "${ESPD_SS_TESTS:-0}" = 1 ]; then
	deps+=(strongswan-charon libcharon-extra-plugins)
fi
missing=()
for p in "${deps[@]}"; do
	if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]; then
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -gt 0 ]; then
	[ "${ESPD_SS_NO_APT:-0}" = 1 ] && die "missing packages: ${missing[*]}"
	log "installing ${missing[*]}"
	if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
fi

# 2. The installed version: 5.9.8-5+deb12u6 -> upstream 5.9.8.
debver=$(dpkg-query -W -f='${Version}' strongswan-libcharon)
upstream=${debver#*:}
upstream=${upstream%-*}
log "charon is strongSwan $debver (upstream $upstream)"
[ -f /usr/lib/ipsec/libcharon.so ] || die "/usr/lib/ipsec/libcharon.so missing"

mkdir -p "$cache"
src="$cache/strongswan-$upstream"

# 3. The source. A Debian revision's .dsc can vanish from the security archive while
#    its binaries are installed; the orig tarball is the same for every revision of
#    the upstream version, so take the installed revision if the registry still has
#    it, else the newest revision of the same upstream version, else the tarball.
deb_src_entries() {
	local f out=/etc/apt/sources.list.d/espd-deb-src.sources
	[ -f "$out" ] && return 0
	: >"$out.tmp"
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] && [ "$f" != "$out" ] || continue
		# deb822: the same stanzas with Types: deb-src.
		sed -e 's/^Types:.*$/Types: deb-src/' "$f" >>"$out.tmp"
		echo >>"$out.tmp"
	done
	if [ -f /etc/apt/sources.list ] && grep -q '^deb ' /etc/apt/sources.list; then
		sed -n 's/^deb \(.*\)$/deb-src \1/p' /etc/apt/sources.list >"${out%.sources}.list"
	fi
	mv "$out.tmp" "$out"
	log "added deb-src entries ($out)"
}

fetch_source() {
	local v dsc=""
	cd "$cache"
	local showsrc versions
	showsrc=$(apt-cache showsrc strongswan 2>/dev/null || true)
	if ! grep -q '^Version:' <<<"$showsrc"; then
		deb_src_entries
		apt-get update -qq
		showsrc=$(apt-cache showsrc strongswan 2>/dev/null || true)
	fi
	grep -q '^Version:' <<<"$showsrc" \
		|| die "the package registry has no strongswan source package (deb-src entries?)"
	# The installed revision first, then the others of the same upstream version,
	# newest first.
	versions=$( (echo "$debver"; sed -n 's/^Version: //p' <<<"$showsrc" \
		| grep -F -- "$upstream-" | sort -rV) | awk '!seen[$0]++')
	# The same revision can be listed by two suites (a point release and the
	# security archive) while only one of them still serves its files: apt picks
	# one, so on failure ask each suite of the deb-src entries for it by name.
	local suites suite
	suites=$(apt-get indextargets --format '$(CODENAME)' 'Created-By: Sources' 2>/dev/null | sort -u)
	for v in $versions; do
		log "fetching strongswan=$v"
		if apt-get source -qq --download-only "strongswan=$v" >/dev/null 2>"$cache/fetch.log"; then
			dsc="$cache/strongswan_${v#*:}.dsc"
			break
		fi
		log "strongswan=$v not available: $(grep -m1 -E '^E:' "$cache/fetch.log" || tail -1 "$cache/fetch.log")"
		for suite in $suites; do
			if apt-get source -qq --download-only "strongswan/$suite" >/dev/null 2>>"$cache/fetch.log" \
				&& [ -f "$cache/strongswan_${v#*:}.dsc" ]; then
				log "fetched strongswan=$v from $suite"
				dsc="$cache/strongswan_${v#*:}.dsc"
				break 2
			fi
		done
	done
	rm -rf "$src.tmp"
	if [ -n "$dsc" ] && [ -f "$dsc" ]; then
		# apt checked the files against the signed Release; dpkg-source's own
		# signature check needs debian-keyring and only warns without it.
		log "unpacking $(basename "$dsc") with Debian's patches"
		dpkg-source -x "$dsc" "$src.tmp" >"$cache/unpack.log" 2>&1 \
			|| die "dpkg-source -x failed; see $cache/unpack.log"
	elif [ -f "$cache/strongswan_$upstream.orig.tar.bz2" ] || [ -f "$cache/strongswan_$upstream.orig.tar.gz" ]; then
		local tarball
		tarball=$(ls "$cache"/strongswan_"$upstream".orig.tar.* | grep -v '\.asc$' | head -1)
		log "no Debian revision of $upstream could be fetched; using $(basename "$tarball")"
		mkdir "$src.tmp"
		tar -xf "$tarball" -C "$src.tmp" --strip-components=1
	else
		die "could not fetch the strongSwan $upstream source (see $cache/fetch.log)"
	fi
	mv "$src.tmp" "$src"
}

[ -f "$src/src/libcharon/daemon.h" ] || fetch_source

# 4. Configure once. Only the options that change public headers matter: mediation
#    (ME) is the one Debian enables. Keep ME in step with the installed libcharon
#    rather than trusting the flag list: its mediation symbols say whether it was built
#    with it. --disable-openssl: 6.0 builds the openssl plugin by default (and needs
#    libssl-dev for it); no plugin shapes the headers the espd plugin uses.
if nm -D /usr/lib/ipsec/libcharon.so | grep -c ' T mediation_manager_create$' >/dev/null; then
	want_me=1
	meflag=--enable-mediation
else
	want_me=0
	meflag=--disable-mediation
fi
stamp="$src/.espd-configured"
if [ ! -f "$src/config.h" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$meflag" ]; then
	log "configuring $src ($meflag; about a minute)"
	(cd "$src" && ./configure --prefix=/usr --sysconfdir=/etc --libdir=/usr/lib \
		--libexecdir=/usr/lib "$meflag" --disable-openssl >"$cache/configure.log" 2>&1) \
		|| die "configure failed; see $cache/configure.log"
	echo "$meflag" >"$stamp"
fi
if grep -Eq '^#define ME( |$)' "$src/config.h"; then have_me=1; else have_me=0; fi
[ "$have_me" = "$want_me" ] || die "config.h has ME=$have_me but libcharon needs ME=$want_me"

# 5. Compile. -z defs: every symbol must come from libcharon, libstrongswan or libc.
#    ESPD_SS_VERSION (MAJOR*10000 + MINOR*100 + PATCH of config.h's VERSION) selects
#    the code for strongSwan 5.9 or 6.0 where their interfaces differ
#    (espd_kernel_ipsec.c says where).
ssver=$(sed -n 's/^#define VERSION "\([0-9.]*\)"$/\1/p' "$src/config.h")
[ -n "$ssver" ] || die "no VERSION in $src/config.h"
case "$ssver" in
5.9.* | 6.0.*) ;;
*) die "strongSwan $ssver: the plugin is written for the kernel_ipsec interfaces of 5.9 (Debian 12) and 6.0 (Debian 13) only; refusing to build a plugin that could misread charon's structures" ;;
esac
IFS=. read -r v_major v_minor v_patch <<<"$ssver"
ssnum=$((v_major * 10000 + v_minor * 100 + ${v_patch:-0}))
out="$cache/build"
mkdir -p "$out"
sources=("$here"/espd_*.c)
so="$out/libstrongswan-espd.so"
need_build=1
if [ -f "$so" ] && [ -z "$(find "$here" -maxdepth 1 -name 'espd_*.[ch]' -newer "$so")" ] \
	&& [ "$so" -nt "$src/config.h" ] && [ "$so" -nt /usr/lib/ipsec/libcharon.so ]; then
	need_build=0
fi
if [ "$need_build" = 1 ]; then
	log "compiling ${#sources[@]} files against strongSwan $ssver (ESPD_SS_VERSION=$ssnum)"
	cc -std=gnu11 -O2 -g -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare \
		-Wno-missing-field-initializers -Wno-format -Werror=implicit-function-declaration \
		-fPIC -shared -include "$src/config.h" -DESPD_SS_VERSION="$ssnum" \
		-I"$src/src/libstrongswan" -I"$src/src/libcharon" -I"$here" \
		"${sources[@]}" -o "$so.tmp" \
		-L/usr/lib/ipsec -Wl,-rpath,/usr/lib/ipsec -lcharon -lstrongswan -lpthread -Wl,-z,defs
	mv "$so.tmp" "$so"
fi
nm -D --defined-only "$so" | grep -c ' T espd_plugin_create$' >/dev/null || die "$so lacks espd_plugin_create"

# 6. Install (or stage, with ESPD_SS_DESTDIR: the logs say which).
verb=installed
[ -z "$destdir" ] || verb="staged in $destdir:"
install -d "$destdir$plugindir" "$destdir$confdir"
if ! cmp -s "$so" "$destdir$plugindir/libstrongswan-espd.so"; then
	install -m 0644 "$so" "$destdir$plugindir/libstrongswan-espd.so.tmp"
	mv "$destdir$plugindir/libstrongswan-espd.so.tmp" "$destdir$plugindir/libstrongswan-espd.so"
	log "$verb $plugindir/libstrongswan-espd.so"
fi
conf="$destdir$confdir/espd.conf"
if [ ! -f "$conf" ] || [ "${ESPD_SS_CONF:-0}" = 1 ]; then
	install -m 0644 "$here/espd.conf" "$conf"
	log "$verb $confdir/espd.conf"
elif ! cmp -s "$here/espd.conf" "$conf"; then
	install -m 0644 "$here/espd.conf" "$conf.espd-new"
	log "kept your $confdir/espd.conf; the shipped one is $confdir/espd.conf.espd-new"
fi
log "done"
