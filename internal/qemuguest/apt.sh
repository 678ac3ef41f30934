# Shell functions shared by the qemu guests' build scripts (xfrmguest/build.sh,
# armguest/build.sh), which source this file: how they reach a Debian
# release's packages, of this machine's architecture or another, without
# touching this machine's apt.
#
# guest_apt CACHE RELEASE [ARCH] sets the array aptc to the apt-get/apt-cache
# options that reach RELEASE's packages for ARCH (a dpkg architecture; this
# machine's when empty): none for this machine's release and architecture,
# else a private configuration in CACHE/apt-RELEASE[-ARCH] (its own
# sources.list for RELEASE and RELEASE-security, from the mirrors this
# machine's apt uses, its own lists and status), whose lists it refreshes
# when they are more than an hour old (if that fails, the lists of an earlier
# run serve), and which keeps apt's package cache (which a Docker image's apt
# configuration may turn off) so that a second run reads it instead of the
# lists. It exits the script when no lists can be had.

# guest_mirror SUITE prints the URI this machine's apt fetches SUITE/main from.
guest_mirror() {
  apt-cache policy | awk -v d="$1/main" '$3 == d && !n++ {print $2}'
}

guest_apt() {
  local cache=$1 rel=$2 arch=${3:-} host hostarch dir main sec keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  host=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  hostarch=$(dpkg --print-architecture)
  [ -n "$arch" ] || arch=$hostarch
  aptc=()
  [ "$rel" != "$host" ] || [ "$arch" != "$hostarch" ] || return 0
  dir="$cache/apt-$rel"
  [ "$arch" = "$hostarch" ] || dir="$dir-$arch"
  mkdir -p "$dir/state/lists/partial" "$dir/cache/archives/partial" "$dir/sources.list.d" "$dir/preferences.d"
  : >>"$dir/status"
  cat >"$dir/apt.conf" <<CONF
APT::Architecture "$arch";
APT::Architectures { "$arch"; };
Dir::Etc::sourcelist "$dir/sources.list";
Dir::Etc::sourceparts "$dir/sources.list.d";
Dir::Etc::preferences "$dir/preferences";
Dir::Etc::preferencesparts "$dir/preferences.d";
Dir::State "$dir/state";
Dir::State::status "$dir/status";
Dir::Cache "$dir/cache";
Dir::Cache::pkgcache "pkgcache.bin";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
CONF
  aptc=(-c "$dir/apt.conf")
  # Lists refreshed in the last hour serve as they are.
  if [ -n "$(find "$dir/updated" -mmin -60 2>/dev/null)" ]; then
    return 0
  fi
  main=$(guest_mirror "$host")
  sec=$(guest_mirror "$host-security")
  printf 'deb [signed-by=%s target=Packages] %s %s main\n' \
    "$keyring" "${main:-http://deb.debian.org/debian}" "$rel" \
    "$keyring" "${sec:-http://deb.debian.org/debian-security}" "$rel-security" >"$dir/sources.list"
  if apt-get "${aptc[@]}" -q --error-on=any update >&2; then
    touch "$dir/updated"
  elif compgen -G "$dir/state/lists/*_Packages*" >/dev/null; then
    echo "apt.sh: apt-get update for $rel ($arch) failed; using the lists of an earlier run" >&2
  else
    echo "apt.sh: apt-get update for $rel ($arch) failed" >&2
    exit 1
  fi
}
