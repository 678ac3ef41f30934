#!/usr/bin/env bash
# Builds the guest of xfrmguest's L2TP/IPsec lab (l2tp_test.go): Debian 12's
# kernel with a Debian 12 user space, for what this machine's kernel lacks
# (PPP, L2TP, XFRM ESP). Unlike build.sh's guests (busybox and iproute2 in
# an initramfs) it boots a whole Debian root file system:
#
#   root/       a debootstrap of bookworm (minbase, with bookworm-updates and
#               bookworm-security) with strongSwan's charon and swanctl,
#               xl2tpd, ppp, iproute2, tcpdump and the kernel's own modules
#               (from the same linux-image package as vmlinuz), which qemu
#               shares with the guest read-only (9p, mount tag espdroot);
#   vmlinuz     that package's kernel;
#   initrd.gz   busybox-static and the modules for 9p and overlayfs: its
#               init mounts root/ under a tmpfs overlay (the guest writes
#               anywhere, nothing reaches the cache), mounts the second 9p
#               share (mount tag espdhost, the test's own directory) at
#               /mnt/host and switches to the root, where it runs the shell
#               commands it reads on the second serial port (ttyS1) with
#               bash, ending each command's output with a line
#               "ESPD-XFRM-RC=<exit status>", as build.sh's guests do.
#
# The image is cached under $ESPD_XFRM_GUEST_CACHE (default
# /var/cache/espd-xfrm-guest, build.sh's cache, so that CI caches it with
# build.sh's images), in a directory l2tp-<key> whose key names the kernel
# package and version, the package list and this script's hash; it is made
# next to its place and renamed into it, so it is complete or absent, and a
# new one removes the older ones. A second run finds it (apt is asked
# nothing then). stdout is one line, the image's directory.
#
# Usage: bash xfrmguest/l2tp-rootfs.sh   (as root; needs debootstrap,
# dpkg-deb, cpio, kmod, network access to $ESPD_NSPAWN_MIRROR or
# deb.debian.org; about 4 minutes the first time)
set -euo pipefail

cache=${ESPD_XFRM_GUEST_CACHE:-/var/cache/espd-xfrm-guest}
mirror=${ESPD_NSPAWN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
# strongswan-charon: the stand-alone charon (/usr/lib/ipsec/charon) both ends
# run; libstrongswan-standard-plugins: openssl, gcm; xl2tpd and ppp: the
# L2TP/PPP ends; nftables: the server's firewall; tcpdump: the capture;
# netbase: /etc/protocols, which swanctl's "dynamic[udp/1701]" needs;
# busybox-static: the initramfs's tools.
packages="strongswan-charon strongswan-swanctl libstrongswan-standard-plugins xl2tpd ppp
  nftables netbase iproute2 iputils-ping procps kmod tcpdump busybox-static"
# The modules the lab loads (l2tp_test.go), checked to be there after the
# modules it cannot need (sound, most drivers: two thirds of the 380 MB)
# are left out.
labmods="veth tun ppp_generic ppp_async ppp_synctty n_hdlc l2tp_ppp l2tp_netlink
  xfrm_user esp4 nf_tables authenc cbc aesni_intel sha256_generic hmac"
# The initramfs's modules (with what modprobe finds they depend on): the PCI
# transport of virtio, 9p over it and overlayfs.
initmods="virtio_pci 9pnet_virtio 9p overlay"
self=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)

mkdir -p "$cache"
exec 9>"$cache/.lock-l2tp"
flock 9

# The kernel: what bookworm's linux-image-amd64 depends on now, asked of
# this machine's apt when it is bookworm (CI's and this machine's are), of
# the root file system's apt otherwise (then only when building).
host=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
kpkg= kver_pkg=
if [ "$host" = "$suite" ]; then
  kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ && !n++ {print $2}')
  kver_pkg=$(apt-cache policy "$kpkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
fi
if [ -n "$kpkg" ] && [ -n "$kver_pkg" ]; then
  key="l2tp-$kpkg-$kver_pkg-$self"
  key=${key//[^A-Za-z0-9.+_-]/_}
  if [ -s "$cache/$key/initrd.gz" ] && [ -d "$cache/$key/root/usr" ]; then
    echo "$cache/$key"
    exit 0
  fi
fi

command -v debootstrap >/dev/null || { echo "l2tp-rootfs: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
work=$(mktemp -d "$cache/l2tp.tmp.XXXXXX")
# proc is unmounted before the tree goes (rm stays on its file system too).
trap 'umount "$work/root/proc" 2>/dev/null || true; rm -rf --one-file-system "$work"' EXIT
root=$work/root
echo "l2tp-rootfs: debootstrap $suite into $root" >&2
debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$work/log" 2>&1 ||
  { tail -20 "$work/log" >&2; exit 1; }
printf 'deb %s %s main\n' "$mirror" "$suite" "$mirror" "$suite-updates" \
  "${mirror%/debian}/debian-security" "$suite-security" >"$root/etc/apt/sources.list"
# No service starts in the chroot.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
mount -t proc proc "$root/proc"
in_root() { chroot "$root" env DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
in_root apt-get -q update >&2
in_root apt-get -q -y upgrade >&2
# shellcheck disable=SC2086
in_root apt-get -q -y install --no-install-recommends $packages >&2
if [ -z "$kpkg" ] || [ -z "$kver_pkg" ]; then
  kpkg=$(in_root apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ && !n++ {print $2}')
  kver_pkg=$(in_root apt-cache policy "$kpkg" | awk '/Candidate:/ {print $2}')
fi
case $kpkg in
  linux-image-6.1.*) ;;
  *) echo "l2tp-rootfs: $suite's linux-image-amd64 is ${kpkg:-nothing}, not a 6.1 kernel" >&2; exit 1 ;;
esac
key="l2tp-$kpkg-$kver_pkg-$self"
key=${key//[^A-Za-z0-9.+_-]/_}
out=$cache/$key
# The kernel's package, unpacked into the root (its modules) without being
# installed: no initramfs-tools, no boot loader.
(cd "$root/tmp" && chroot "$root" sh -c "cd /tmp && apt-get -q download '$kpkg=$kver_pkg'") >&2
dpkg-deb -x "$root"/tmp/"$kpkg"_*.deb "$work/kernel"
kver=$(ls "$work/kernel/lib/modules")
mkdir -p "$root/lib/modules"
cp -a "$work/kernel/lib/modules/$kver" "$root/lib/modules/"
kdir=$root/lib/modules/$kver/kernel
rm -rf "$kdir/sound"
find "$kdir/drivers" -mindepth 1 -maxdepth 1 ! -name net ! -name virtio ! -name tty ! -name char -exec rm -rf {} +
rm -rf "$kdir"/drivers/net/{wireless,ethernet,usb,can,wwan,ieee802154}
depmod -b "$root" "$kver"
for m in $labmods $initmods; do
  modprobe -d "$root" -S "$kver" --show-depends "$m" >/dev/null ||
    { echo "l2tp-rootfs: kernel $kver has no module $m (or one it needs)" >&2; exit 1; }
done
in_root apt-get clean
rm -f "$root"/tmp/*.deb "$root/usr/sbin/policy-rc.d"
rm -rf "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
umount "$root/proc"

# The initramfs.
ird=$work/initrd
mkdir -p "$ird"/{bin,proc,sys,dev,lower,upper,newroot,lib/modules/"$kver"}
cp "$root/bin/busybox" "$ird/bin/busybox"
for applet in sh mount umount mkdir insmod switch_root poweroff cat cp echo sleep; do
  ln -s busybox "$ird/bin/$applet"
done
: >"$ird/lib/modules/$kver/modules.order"
for m in $initmods; do
  modprobe -d "$root" -S "$kver" --show-depends "$m" ||
    { echo "l2tp-rootfs: kernel $kver has no module $m" >&2; exit 1; }
done | awk '$1 == "insmod" && !seen[$2]++ {print $2}' | while read -r ko; do
  cp "$ko" "$ird/lib/modules/$kver/"
  basename "$ko" >>"$ird/lib/modules/$kver/modules.order"
done

cat >"$ird/init" <<'INIT'
#!/bin/sh
export PATH=/bin
fail() { echo "l2tp guest init: $*" >/dev/console; poweroff -f; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
cd "/lib/modules/$(cat /proc/sys/kernel/osrelease)" || fail "no modules"
while read -r ko; do
  insmod "$ko" || fail "insmod $ko"
done <modules.order
cd /
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro espdroot /lower || fail "mount espdroot"
mount -t tmpfs -o mode=0755 tmpfs /upper || fail "tmpfs"
mkdir -p /upper/rw /upper/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/rw,workdir=/upper/work /newroot || fail "overlay"
mkdir -p /newroot/mnt/host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 espdhost /newroot/mnt/host || fail "mount espdhost"
cp /stage2 /newroot/sbin/espd-guest-init || fail "stage2"
mount -o move /dev /newroot/dev
umount /sys
umount /proc
exec switch_root /newroot /sbin/espd-guest-init
INIT
cat >"$ird/stage2" <<'STAGE2'
#!/bin/bash
# The Debian root's init: file systems, then the command loop on ttyS1.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C
mount -t proc proc /proc
mount -t sysfs sysfs /sys
[ -e /dev/ttyS1 ] || mount -t devtmpfs devtmpfs /dev
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs tmpfs /tmp
mkdir -p /dev/pts /dev/shm /run/netns
mount -t devpts -o ptmxmode=0666,newinstance devpts /dev/pts
ln -sf pts/ptmx /dev/ptmx
mount -t tmpfs tmpfs /dev/shm
echo /sbin/modprobe >/proc/sys/kernel/modprobe
ip link set lo up
# ttyS1 stays open from here on: its last close would drop input not yet read.
exec 3<>/dev/ttyS1
stty raw -echo <&3
echo "ESPD-XFRM-READY" >&3
while IFS= read -r cmd; do
  bash -c "$cmd" </dev/null >/tmp/.out 2>&1
  rc=$?
  cat /tmp/.out
  echo "ESPD-XFRM-RC=$rc"
done <&3 >&3
echo o >/proc/sysrq-trigger
STAGE2
chmod +x "$ird/init" "$ird/stage2"

mkdir -p "$work/out"
cp "$work/kernel/boot/vmlinuz-$kver" "$work/out/vmlinuz"
(cd "$ird" && find . | cpio -o -H newc --quiet) | gzip -1 >"$work/out/initrd.gz"
echo "$kver" >"$work/out/kernel-version"
echo "$key" >"$work/out/key"
mv "$root" "$work/out/root"
rm -rf "$out"
mv "$work/out" "$out"
# Older images of this lab are stale.
find "$cache" -mindepth 1 -maxdepth 1 -type d -name 'l2tp-*' ! -name "$key" -exec rm -rf {} +
echo "$out"
