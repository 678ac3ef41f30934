#!/usr/bin/env bash
# packaging/purge-check.sh: purge the installed espd and strongswan-espd packages
# with apt-get and check that nothing of them is left: no file they listed
# (dpkg -L), no unit file or enable link of espd's, no record of deb-systemd-helper's,
# no /var/lib/espd, no process running the installed espd. Run as root by .ci/run after the smoke test.
# It also checks, before purging, that installing enabled espd.service (if it has an
# [Install] section).
set -euo pipefail

log() { printf 'purge-check: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

pkgs=(strongswan-espd espd)
for p in "${pkgs[@]}"; do
	[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = "install ok installed" ] \
		|| die "$p is not installed"
done
if grep -q '^\[Install\]' /usr/lib/systemd/system/espd.service; then
	[ -n "$(find /etc/systemd/system -path '*.wants/espd.service' -type l)" ] \
		|| die "installing espd did not enable espd.service (no link in /etc/systemd/system/*.wants)"
fi
# The shipped units, as dpkg installed them, and the enable links made for them.
listed=$(dpkg-query -L "${pkgs[@]}")
units=$(grep -E '^/usr/lib/systemd/system/[^/]+\.(service|socket|timer|path|target)$' <<<"$listed" \
	| xargs -rn1 basename)
[ -n "$units" ] || die "the espd package lists no unit in /usr/lib/systemd/system"

espd_inode=$(stat -c %d:%i /usr/sbin/espd)

# An administrator enables espd-ike.service by hand (docs/deploy.md, section 6:
# `systemctl enable --now espd-ike`); purge must not leave that link dangling.
mkdir -p /etc/systemd/system/multi-user.target.wants
ln -sfn /usr/lib/systemd/system/espd-ike.service /etc/systemd/system/multi-user.target.wants/espd-ike.service

log "apt-get purge ${pkgs[*]}"
apt-get purge -y -qq "${pkgs[@]}" >/dev/null

left=()
for p in "${pkgs[@]}"; do
	st=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
	case "$st" in "" | "un"*) ;; *) left+=("package $p: dpkg status '$st'") ;; esac
done
while IFS= read -r f; do
	[ -n "$f" ] || continue
	if [ -d "$f" ] && [ ! -L "$f" ]; then
		# Directories the packages made for themselves go; shared ones
		# (/usr/sbin, /etc/strongswan.d/charon, ...) stay.
		case "$f" in /usr/share/doc/espd* | /usr/share/doc/strongswan-espd*) left+=("directory $f") ;; esac
	elif [ -e "$f" ] || [ -L "$f" ]; then
		left+=("file $f")
	fi
done <<<"$listed"
for u in $units; do
	while IFS= read -r f; do
		[ -n "$f" ] && left+=("$f (unit $u)")
	done < <(find /etc/systemd/system /usr/lib/systemd/system /var/lib/systemd/deb-systemd-helper-enabled \
		/var/lib/systemd/deb-systemd-helper-masked -name "$u*" 2>/dev/null)
done
for d in /var/lib/espd /var/lib/private/espd; do
	[ ! -e "$d" ] && [ ! -L "$d" ] || left+=("$d")
done
# A process still running the package's espd (the file is gone, its inode is not).
for exe in /proc/[0-9]*/exe; do
	if [ "$(stat -L -c %d:%i "$exe" 2>/dev/null || true)" = "$espd_inode" ]; then
		left+=("running espd: pid $(basename "$(dirname "$exe")")")
	fi
done

if [ ${#left[@]} -gt 0 ]; then
	printf 'purge-check: left after apt-get purge: %s\n' "${left[@]}" >&2
	exit 1
fi
log "nothing of ${pkgs[*]} is left ($(wc -l <<<"$listed") paths checked; units: $(paste -sd" " <<<"$units"))"
