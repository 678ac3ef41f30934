#!/usr/bin/env bash
# Builds the guests that xfrmguest's tests boot under qemu, one per kernel:
# "6.1" is Debian 12's own kernel, "6.12" Debian 13's (each has XFRM ESP and
# the AEAD templates as modules), each with a small initramfs of busybox-static,
# iproute2 and those modules. The user space is the same in both (this
# machine's release's busybox-static and iproute2), so that what differs
# between the guests is the kernel's. Its init loads the modules, gives eth0
# an address and then runs the shell commands it reads on the second serial
# port (ttyS1), ending each command's output with a line
# "ESPD-XFRM-RC=<exit status>".
#
# Everything comes from Debian's registry with apt-get download, pinned to the
# exact versions apt finds now. A kernel of another release than this
# machine's comes through a private apt configuration under the cache
# (apt-<release>: its own sources.list for <release> and <release>-security,
# from the mirrors this machine's apt uses, its own lists and status; this
# machine's apt is never touched), whose lists a run refreshes if they are
# more than an hour old (if that fails, the lists of an earlier run serve).
# The images are cached under $ESPD_XFRM_GUEST_CACHE (default
# /var/cache/espd-xfrm-guest), each in a directory named for its kernel
# series and package version, one per kernel, so a second run only checks
# the versions. stdout has one line per kernel, in the order asked: its
# image's directory, which holds vmlinuz, initrd.gz, kernel-version and
# series.
#
# Usage: bash xfrmguest/build.sh [6.1] [6.12]   (both when none is named; as
# root; needs apt-get, dpkg-deb, cpio, kmod)
set -euo pipefail

cache=${ESPD_XFRM_GUEST_CACHE:-/var/cache/espd-xfrm-guest}
# The kernel series and the Debian release whose linux-image-amd64 each is.
declare -A release=([6.1]=bookworm [6.12]=trixie)
[ $# -gt 0 ] || set -- 6.1 6.12
for series in "$@"; do
  [ -n "${release[$series]:-}" ] || { echo "usage: build.sh [6.1] [6.12]" >&2; exit 2; }
done
# The private apt configurations (guest_apt), shared with armguest/build.sh.
lib="$(dirname "${BASH_SOURCE[0]}")/../internal/qemuguest/apt.sh"
. "$lib"
# This script's own hash and its library's are part of every cache key: a
# change to either builds new images.
self=$(cat "${BASH_SOURCE[0]}" "$lib" | sha256sum | cut -c1-12)

# One build at a time (flock, util-linux); a second waits and finds the cache.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# apt-get download fetches as _apt when that user can write the directory.
chown _apt "$work" 2>/dev/null || true

# The user space, from this machine's release.
bbver=$(apt-cache policy busybox-static | awk '/Candidate:/ {print $2}')
ipver=$(apt-cache policy iproute2 | awk '/Candidate:/ {print $2}')
[ -n "$bbver" ] && [ "$bbver" != "(none)" ] && [ -n "$ipver" ] && [ "$ipver" != "(none)" ] ||
  { echo "build.sh: apt knows no busybox-static or iproute2 (apt-get update?)" >&2; exit 1; }

# The modules: ESP for IPv4 and IPv6, the netlink interface ip xfrm uses, the
# AEAD and CBC+HMAC transforms in their generic (C) forms, and virtio-net for
# eth0, with every dependency modprobe finds in modules.dep (some are built
# into one kernel or both: modprobe says so and nothing is copied). drbg and
# jitterentropy_rng: seqiv and echainiv take their salt from the default RNG;
# pcrypt and crypto_user (which instantiates pcrypt), camellia and 3DES for the
# harness's kernel-only rows; veth and tun for the harness's namespaces and
# espd's TUN when the harness runs inside the guest (and nfnetlink: espd's
# netlink handle opens a NETLINK_NETFILTER socket too); xfrm_interface for
# route-based tunnels (ip link add ... type xfrm if_id N); the x86 drivers
# (AES-NI, PCLMULQDQ GHASH, SIMD ChaCha20 and Poly1305: qemu's "-cpu max"
# has those instructions), so that the kernel picks them as on a gateway
# with AES-NI and the harness's no-AES-NI rows show their switch to the
# generic drivers. Loaded in this order by init; crypto templates the kernel asks for later (request_module)
# are found by busybox's modprobe in the same tree.
mods="virtio_pci virtio_net xfrm_user esp4 esp6 xfrm4_tunnel xfrm6_tunnel
  aes_generic gcm ghash_generic ctr chacha20poly1305 chacha_generic poly1305_generic
  authenc authencesn cbc hmac sha1_generic sha256_generic sha512_generic seqiv echainiv
  drbg jitterentropy_rng crypto_null ecb pcrypt crypto_user camellia_generic des_generic
  veth tun nfnetlink xfrm_interface
  aesni_intel ghash_clmulni_intel chacha_x86_64 poly1305_x86_64"

# build SERIES builds (or finds) the image of the kernel SERIES and prints
# its directory.
build() {
  local series=$1 rel=${release[$1]} kpkg kver_pkg key out w kver
  guest_apt "$cache" "$rel"
  # The kernel package that linux-image-amd64 currently points at, and its version.
  kpkg=$(apt-cache "${aptc[@]}" depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ && !n++ {print $2}')
  [ -n "$kpkg" ] || { echo "build.sh: apt knows no linux-image-amd64 of $rel (apt-get update?)" >&2; exit 1; }
  case $kpkg in
    linux-image-"$series".*) ;;
    *) echo "build.sh: $rel's linux-image-amd64 is $kpkg, not a $series kernel" >&2; exit 1 ;;
  esac
  kver_pkg=$(apt-cache "${aptc[@]}" policy "$kpkg" | awk '/Candidate:/ {print $2}')
  # The cache key: the series, the kernel's package and version, the tools'
  # versions and this script's hash.
  key="linux$series-$kpkg-$kver_pkg-bb$bbver-ip$ipver-$self"
  key=${key//[^A-Za-z0-9.+_-]/_}
  out="$cache/$key"
  if [ -s "$out/initrd.gz" ] && [ -s "$out/vmlinuz" ]; then
    echo "$out"
    return 0
  fi

  w="$work/$series"
  mkdir -p "$w"
  # apt-get download fetches as _apt when that user can write the directory.
  chown _apt "$w" 2>/dev/null || true
  cd "$w"
  apt-get "${aptc[@]}" download -q "$kpkg=$kver_pkg" >&2
  apt-get download -q "busybox-static=$bbver" "iproute2=$ipver" >&2
  mkdir kernel tools root
  dpkg-deb -x "$kpkg"_*.deb kernel
  dpkg-deb -x busybox-static_*.deb tools
  dpkg-deb -x iproute2_*.deb tools
  # Debian 13 ships the modules under /usr/lib (merged /usr); kmod here
  # looks under <base>/lib.
  if [ ! -d kernel/lib/modules ] && [ -d kernel/usr/lib/modules ]; then
    mkdir -p kernel/lib
    mv kernel/usr/lib/modules kernel/lib/modules
  fi
  kver=$(ls kernel/lib/modules)
  case $kver in
    "$series".*) ;;
    *) echo "build.sh: $kpkg holds kernel $kver, not $series" >&2; exit 1 ;;
  esac

  # The root file system: busybox's applets, ip, and ip's shared libraries.
  mkdir -p root/{bin,sbin,etc,proc,sys,dev,tmp,run,lib/modules}
  cp tools/bin/busybox root/bin/busybox
  # Every applet but ip, which is iproute2's (busybox's cannot do xfrm).
  for applet in $(root/bin/busybox --list); do
    [ "$applet" = ip ] || [ -e "root/bin/$applet" ] || ln -s busybox "root/bin/$applet"
  done
  cp tools/bin/ip root/sbin/ip
  # ldd resolves against this machine's libraries, of the same release as
  # the iproute2 package; copy each one to the same path.
  for lib in $(ldd root/sbin/ip | grep -o '/[^ ]*'); do
    mkdir -p "root$(dirname "$lib")"
    cp -L "$lib" "root$lib"
  done

  depmod -b kernel "$kver"
  mkdir -p "root/lib/modules/$kver"
  : >"root/lib/modules/$kver/modules.order"
  # A module neither kernel file nor built in fails the build. Compressed
  # modules (Debian 13's are .ko.xz) are stored decompressed, with busybox's
  # unxz, for busybox's insmod.
  for m in $mods; do
    modprobe -d kernel -S "$kver" --show-depends "$m" ||
      { echo "build.sh: kernel $kver has no module $m" >&2; exit 1; }
  done | awk '$1 == "insmod" && !seen[$2]++ {print $2}' | while read -r ko; do
    rel=${ko#*/lib/modules/"$kver"/}
    rel=${rel%.xz}
    mkdir -p "root/lib/modules/$kver/$(dirname "$rel")"
    case $ko in
      *.ko.xz) tools/bin/busybox unxz -c "$ko" >"root/lib/modules/$kver/$rel" ;;
      *.ko) cp "$ko" "root/lib/modules/$kver/$rel" ;;
      *) echo "build.sh: $ko: a module compression this script does not know" >&2; exit 1 ;;
    esac
    echo "$rel" >>"root/lib/modules/$kver/modules.order"
  done
  cp kernel/lib/modules/"$kver"/modules.builtin* "root/lib/modules/$kver/"
  depmod -b root "$kver"

  cat >root/init <<'INIT'
#!/bin/sh
export PATH=/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo /bin/modprobe >/proc/sys/kernel/modprobe
cd "/lib/modules/$(uname -r)"
while read -r ko; do
  insmod "$ko" || echo "init: insmod $ko failed" >/dev/console
done <modules.order
cd /
/sbin/ip link set lo up
addr=$(sed -n 's/.*espd.addr=\([^ ]*\).*/\1/p' /proc/cmdline)
addr6=$(sed -n 's/.*espd.addr6=\([^ ]*\).*/\1/p' /proc/cmdline)
/sbin/ip link set eth0 up
[ -n "$addr" ] && /sbin/ip addr add "$addr" dev eth0
[ -n "$addr6" ] && /sbin/ip addr add "$addr6" dev eth0 nodad
mkdir -p /run/netns
# ttyS1 stays open from here on: its last close would drop input not yet read.
exec 3<>/dev/ttyS1
stty raw -echo <&3
echo "ESPD-XFRM-READY" >&3
# busybox's sh runs its own applets before anything on PATH, so ip is made a
# function that runs iproute2's.
while IFS= read -r cmd; do
  sh -c "ip() { /sbin/ip \"\$@\"; }; $cmd" </dev/null >/tmp/out 2>&1
  rc=$?
  cat /tmp/out
  echo "ESPD-XFRM-RC=$rc"
done <&3 >&3
poweroff -f
INIT
  chmod +x root/init

  mkdir -p "$out.tmp"
  cp "kernel/boot/vmlinuz-$kver" "$out.tmp/vmlinuz"
  (cd root && find . | cpio -o -H newc --quiet) | gzip -1 >"$out.tmp/initrd.gz"
  echo "$kver" >"$out.tmp/kernel-version"
  echo "$series" >"$out.tmp/series"
  echo "$key" >"$out.tmp/key"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  cd /
  rm -rf "$w"
  # Images of this series' other kernel versions or of an older build.sh,
  # and those of before there were several kernels, are stale.
  find "$cache" -mindepth 1 -maxdepth 1 -type d \( -name "linux$series-*" -o -name 'linux-image-*' \) \
    ! -name "$key" -exec rm -rf {} +
  echo "$out"
}

for series in "$@"; do
  build "$series"
done
