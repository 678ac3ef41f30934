package xfrmguest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/espd/espd/testbed"
)

// RootImage is a guest with a whole Debian root file system, built by
// l2tp-rootfs.sh: Debian 12's kernel, an initramfs that mounts Root
// (shared read-only over 9p) under a tmpfs overlay, and Root, which holds
// that kernel's modules and what the L2TP/IPsec lab runs (strongSwan's
// charon and swanctl, xl2tpd, pppd, iproute2, tcpdump).
type RootImage struct {
	// Dir is the cache directory that holds the files.
	Dir string
	// Kernel is the kernel image (vmlinuz), Initrd the initramfs.
	Kernel, Initrd string
	// Root is the root file system's directory.
	Root string
	// KernelVersion is the kernel's release (uname -r).
	KernelVersion string
}

// BuildRoot runs the build script (l2tp-rootfs.sh in this package's
// directory), which builds the image or finds it in its cache, and returns
// the image.
func BuildRoot(ctx context.Context, script string) (RootImage, error) {
	cmd := exec.CommandContext(ctx, "bash", script)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return RootImage{}, fmt.Errorf("xfrmguest: %s: %w: %s", script, err, testbed.Tail(stderr.String(), 20))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := lines[len(lines)-1]
	kv, err := os.ReadFile(filepath.Join(dir, "kernel-version"))
	if err != nil {
		return RootImage{}, fmt.Errorf("xfrmguest: %s did not leave an image: %w", script, err)
	}
	img := RootImage{
		Dir:           dir,
		Kernel:        filepath.Join(dir, "vmlinuz"),
		Initrd:        filepath.Join(dir, "initrd.gz"),
		Root:          filepath.Join(dir, "root"),
		KernelVersion: strings.TrimSpace(string(kv)),
	}
	for _, f := range []string{img.Kernel, img.Initrd, filepath.Join(img.Root, "usr")} {
		if _, err := os.Stat(f); err != nil {
			return RootImage{}, fmt.Errorf("xfrmguest: image incomplete: %w", err)
		}
	}
	return img, nil
}

// RootOptions configure a boot of a RootImage.
type RootOptions struct {
	// Node is the namespace that runs qemu. The guest has no network
	// interface: what it tests runs in its own namespaces.
	Node *testbed.Node
	// Share is a directory of this machine that the guest mounts
	// read-write at /mnt/host (9p): files for the guest and what it
	// leaves for the test (captures, logs).
	Share string
	// MemoryMB is the guest's memory; 0 means 1024.
	MemoryMB int
	// WorkDir receives qemu's log, the guest's console and the command
	// socket.
	WorkDir string
}

// BootRoot starts qemu with the image in the namespace and waits, at most
// BootTimeout or until ctx ends, for the guest's init to read commands on
// its command port, as Boot does: the Guest's Run and MustRun run bash
// command lines in the Debian root, as root. The caller stops the guest
// with Close.
func BootRoot(ctx context.Context, img RootImage, o RootOptions) (*Guest, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	mem := o.MemoryMB
	if mem == 0 {
		mem = 1024
	}
	sock := filepath.Join(o.WorkDir, "guest.sock")
	g := &Guest{Console: filepath.Join(o.WorkDir, "guest-console.log")}
	start := time.Now()
	// qemu waits for the command socket's client (wait=on) before it starts
	// the guest, so the guest's first line is never lost.
	proc, err := o.Node.Start(filepath.Join(o.WorkDir, "qemu.log"), QEMU,
		"-accel", "tcg", "-cpu", "max", "-smp", "1", "-m", strconv.Itoa(mem),
		"-nographic", "-no-reboot", "-monitor", "none", "-nic", "none",
		"-kernel", img.Kernel, "-initrd", img.Initrd,
		"-append", "console=ttyS0 quiet panic=-1",
		"-virtfs", "local,path="+img.Root+",mount_tag=espdroot,security_model=none,readonly=on",
		"-virtfs", "local,path="+o.Share+",mount_tag=espdhost,security_model=none",
		"-serial", "file:"+g.Console,
		"-serial", "unix:"+sock+",server=on,wait=on")
	if err != nil {
		return nil, err
	}
	g.proc = proc
	ctx, cancel := context.WithTimeout(ctx, BootTimeout)
	defer cancel()
	for g.conn == nil {
		c, err := net.Dial("unix", sock)
		if err == nil {
			g.conn = c
			break
		}
		select {
		case <-proc.Done():
			return nil, fmt.Errorf("xfrmguest: qemu exited: %s", testbed.Tail(proc.Log(), 10))
		case <-ctx.Done():
			g.Close()
			return nil, fmt.Errorf("xfrmguest: no command socket from qemu: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	g.rd = bufio.NewReader(g.conn)
	if _, _, err := g.readUntil(ctx, func(l string) bool { return l == readyLine }); err != nil {
		g.Close()
		return nil, fmt.Errorf("xfrmguest: guest did not come up: %w; console: %s", err, g.consoleTail())
	}
	g.BootTime = time.Since(start)
	return g, nil
}
