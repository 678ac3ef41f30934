#!/usr/bin/env bash
# Builds the guest that xfrmguest's tests boot under qemu: Debian 12's own
# kernel (which has XFRM ESP and the AEAD templates as modules) and a small
# initramfs with busybox-static, iproute2 and those modules. Its init loads
# the modules, gives eth0 an address and then runs the shell commands it reads
# on the second serial port (ttyS1), ending each command's output with a line
# "ESPD-XFRM-RC=<exit status>".
#
# Everything comes from Debian's registry with apt-get download, pinned to the
# exact versions apt finds now, and is cached under $ESPD_XFRM_GUEST_CACHE
# (default /var/cache/espd-xfrm-guest) in a directory named for the kernel
# package's version, so a second run only checks the versions. The last line
# on stdout is that directory: it holds vmlinuz, initrd.gz and kernel-version.
#
# Usage: bash xfrmguest/build.sh   (as root; needs apt-get, dpkg-deb, cpio, kmod)
set -euo pipefail

cache=${ESPD_XFRM_GUEST_CACHE:-/var/cache/espd-xfrm-guest}

# The kernel package that linux-image-amd64 currently points at, and its version.
kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$kpkg" ] || { echo "build.sh: apt knows no linux-image-amd64 (apt-get update?)" >&2; exit 1; }
kver_pkg=$(apt-cache policy "$kpkg" | awk '/Candidate:/ {print $2}')
bbver=$(apt-cache policy busybox-static | awk '/Candidate:/ {print $2}')
ipver=$(apt-cache policy iproute2 | awk '/Candidate:/ {print $2}')
# The cache key: the kernel's package and version, the tools' versions and
# this script's own hash (a change to it builds a new image).
self=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)
key="$kpkg-$kver_pkg-bb$bbver-ip$ipver-$self"
key=${key//[^A-Za-z0-9.+_-]/_}
out="$cache/$key"
# One build at a time (flock, util-linux); a second waits and finds the cache.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ -s "$out/initrd.gz" ] && [ -s "$out/vmlinuz" ]; then
  echo "$out"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# apt-get download fetches as _apt when that user can write the directory.
chown _apt "$work" 2>/dev/null || true
cd "$work"
apt-get download -q "$kpkg=$kver_pkg" "busybox-static=$bbver" "iproute2=$ipver" >&2
mkdir kernel tools root
dpkg-deb -x "$kpkg"_*.deb kernel
dpkg-deb -x busybox-static_*.deb tools
dpkg-deb -x iproute2_*.deb tools
kver=$(ls kernel/lib/modules)

# The root file system: busybox's applets, ip, and ip's shared libraries.
mkdir -p root/{bin,sbin,etc,proc,sys,dev,tmp,run,lib/modules}
cp tools/bin/busybox root/bin/busybox
# Every applet but ip, which is iproute2's (busybox's cannot do xfrm).
for applet in $(root/bin/busybox --list); do
  [ "$applet" = ip ] || [ -e "root/bin/$applet" ] || ln -s busybox "root/bin/$applet"
done
cp tools/bin/ip root/sbin/ip
# ldd resolves against this machine's libraries, which are Debian 12's too (the
# same release as the iproute2 package); copy each one to the same path.
for lib in $(ldd root/sbin/ip | grep -o '/[^ ]*'); do
  mkdir -p "root$(dirname "$lib")"
  cp -L "$lib" "root$lib"
done

# The modules: ESP for IPv4 and IPv6, the netlink interface ip xfrm uses, the
# AEAD and CBC+HMAC transforms in their generic (C) forms, and virtio-net for
# eth0, with every dependency modprobe finds in modules.dep. drbg and
# jitterentropy_rng: seqiv and echainiv take their salt from the default RNG;
# pcrypt and crypto_user (which instantiates pcrypt), camellia and 3DES for the
# harness's kernel-only rows; veth and tun for the harness's namespaces and
# espd's TUN when the harness runs inside the guest (and nfnetlink: espd's
# netlink handle opens a NETLINK_NETFILTER socket too); xfrm_interface for
# route-based tunnels (ip link add ... type xfrm if_id N). Loaded in this
# order by init; crypto templates the kernel asks for later (request_module)
# are found by busybox's modprobe in the same tree.
mods="virtio_pci virtio_net xfrm_user esp4 esp6 xfrm4_tunnel xfrm6_tunnel
  aes_generic gcm ghash_generic ctr chacha20poly1305 chacha_generic poly1305_generic
  authenc authencesn cbc hmac sha1_generic sha256_generic sha512_generic seqiv echainiv
  drbg jitterentropy_rng crypto_null ecb pcrypt crypto_user camellia_generic des_generic
  veth tun nfnetlink xfrm_interface"
depmod -b kernel "$kver"
mkdir -p "root/lib/modules/$kver"
: >"root/lib/modules/$kver/modules.order"
for m in $mods; do
  modprobe -d kernel -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  rel=${ko#*/lib/modules/"$kver"/}
  mkdir -p "root/lib/modules/$kver/$(dirname "$rel")"
  cp "$ko" "root/lib/modules/$kver/$rel"
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
echo "$key" >"$out.tmp/key"
rm -rf "$out"
mv "$out.tmp" "$out"
# Images of other kernel versions or of an older build.sh are stale.
find "$cache" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
echo "$out"
