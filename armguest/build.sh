#!/usr/bin/env bash
# Builds the kernels that armguest's tests boot under qemu-system-aarch64
# and qemu-system-arm, one per architecture: "arm64" is Debian 12's
# linux-image-arm64, "armhf" its linux-image-armmp-lpae, each with an
# initramfs that holds nothing but the modules the test needs and their
# dependencies (virtio-mmio, virtio-net for eth0, virtio-rng for the
# entropy espd's keys and IVs wait for, tun for espd's TUN, nfnetlink and
# xfrm_user for the netlink families its TUN's handle opens), uncompressed,
# and a file /lib/modules/modules.order that lists them in the order to
# load. The test appends the user space, all
# of it Go (the init, espd, a configuration), as a second archive.
#
# The packages come from Debian's registry with apt-get download through a
# private apt configuration of that architecture (internal/qemuguest/apt.sh;
# this machine's apt is never touched), pinned to the versions apt finds
# now. The images are cached under $ESPD_ARM_GUEST_CACHE (default
# /var/cache/espd-arm-guest), each in a directory named for its kernel
# package and version, so a second run only checks the versions. stdout has
# one line per architecture, in the order asked: its image's directory,
# which holds vmlinuz, initrd.gz, kernel-version and arch.
#
# Usage: bash armguest/build.sh [arm64] [armhf]   (both when none is named; as
# root; needs apt-get, dpkg-deb, cpio, kmod, xz-utils)
set -euo pipefail

cache=${ESPD_ARM_GUEST_CACHE:-/var/cache/espd-arm-guest}
rel=bookworm
declare -A flavour=([arm64]=arm64 [armhf]=armmp-lpae)
[ $# -gt 0 ] || set -- arm64 armhf
for arch in "$@"; do
  [ -n "${flavour[$arch]:-}" ] || { echo "usage: build.sh [arm64] [armhf]" >&2; exit 2; }
done
lib="$(dirname "${BASH_SOURCE[0]}")/../internal/qemuguest/apt.sh"
. "$lib"
# This script's hash and its library's are part of every cache key.
self=$(cat "${BASH_SOURCE[0]}" "$lib" | sha256sum | cut -c1-12)

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# apt-get download fetches as _apt when that user can write the directory.
chown _apt "$work" 2>/dev/null || true

mods="virtio_mmio virtio_net virtio_rng tun nfnetlink xfrm_user"

# build ARCH builds (or finds) the image of ARCH and prints its directory.
build() {
  local arch=$1 meta kpkg kver_pkg key out w kver
  meta=linux-image-${flavour[$arch]}
  guest_apt "$cache" "$rel" "$arch"
  kpkg=$(apt-cache "${aptc[@]}" depends "$meta" | awk '/Depends: linux-image-[0-9]/ && !n++ {print $2}')
  [ -n "$kpkg" ] || { echo "build.sh: apt knows no $meta of $rel for $arch" >&2; exit 1; }
  kver_pkg=$(apt-cache "${aptc[@]}" policy "$kpkg" | awk '/Candidate:/ {print $2}')
  key="$arch-$kpkg-$kver_pkg-$self"
  key=${key//[^A-Za-z0-9.+_-]/_}
  out="$cache/$key"
  if [ -s "$out/initrd.gz" ] && [ -s "$out/vmlinuz" ]; then
    echo "$out"
    return 0
  fi
  w="$work/$arch"
  mkdir -p "$w"
  # apt-get download fetches as _apt when that user can write the directory.
  chown _apt "$w" 2>/dev/null || true
  cd "$w"
  apt-get "${aptc[@]}" download -q "$kpkg:$arch=$kver_pkg" >&2
  mkdir kernel root
  dpkg-deb -x "$kpkg"_*.deb kernel
  if [ ! -d kernel/lib/modules ] && [ -d kernel/usr/lib/modules ]; then
    mkdir -p kernel/lib
    mv kernel/usr/lib/modules kernel/lib/modules
  fi
  kver=$(ls kernel/lib/modules)
  depmod -b kernel "$kver"
  mkdir -p root/lib/modules
  : >root/lib/modules/modules.order
  # A module that is neither a file nor built in fails the build; one built
  # in (modprobe prints "builtin") is not copied.
  for m in $mods; do
    modprobe -d kernel -S "$kver" --show-depends "$m" ||
      { echo "build.sh: kernel $kver has no module $m" >&2; exit 1; }
  done | awk '$1 == "insmod" && !seen[$2]++ {print $2}' | while read -r ko; do
    name=$(basename "$ko")
    case $ko in
      *.ko.xz) name=${name%.xz}; xz -dc "$ko" >"root/lib/modules/$name" ;;
      *.ko) cp "$ko" "root/lib/modules/$name" ;;
      *) echo "build.sh: $ko: a module compression this script does not know" >&2; exit 1 ;;
    esac
    echo "$name" >>root/lib/modules/modules.order
  done
  mkdir -p "$out.tmp"
  cp "kernel/boot/vmlinuz-$kver" "$out.tmp/vmlinuz"
  (cd root && find . | cpio -o -H newc --quiet) | gzip -1 >"$out.tmp/initrd.gz"
  echo "$kver" >"$out.tmp/kernel-version"
  echo "$arch" >"$out.tmp/arch"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  cd /
  rm -rf "$w"
  # Images of this architecture's other kernels or of an older build.sh are stale.
  find "$cache" -mindepth 1 -maxdepth 1 -type d -name "$arch-*" ! -name "$key" -exec rm -rf {} +
  echo "$out"
}

for arch in "$@"; do
  build "$arch"
done
