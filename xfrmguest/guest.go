// Package xfrmguest boots a Linux kernel that has XFRM ESP under qemu, so
// that tests can key the kernel's ESP and exchange packets with espd on a
// machine whose own kernel has no ESP. build.sh builds one guest per kernel
// of Kernels: "6.1" is Debian 12's own kernel package, "6.12" Debian 13's,
// each with the same small busybox and iproute2 initramfs (the user space
// of this machine's release), so that what differs is the kernel's.
//
// The guest has one network interface, eth0 (virtio-net), attached to a tap
// device in a network namespace of the caller's; its init gives eth0 the
// address of Options.Addr and then runs the shell commands that Guest.Run
// sends it on its second serial port. qemu runs under software emulation
// (TCG) with one vCPU and 512 MB, so the guest is slow but correct: its
// figures measure nothing but function.
//
// The two kernels behave alike in everything the tests compare (packet
// and error counts, ESN, UDP encapsulation, XFRM interfaces) but one: 6.12's /proc/net/xfrm_stat ends in two more counters,
// XfrmOutStateDirError and XfrmInStateDirError (states with a direction,
// Linux 6.10), which states without one never move.
// docs/dev/xfrm-interop.md lists what was compared.
package xfrmguest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/espd/espd/internal/qemuguest"
	"github.com/espd/espd/testbed"
)

// QEMU is the qemu binary the guest runs under.
const QEMU = "qemu-system-x86_64"

// BootTimeout bounds a boot, from qemu's start to the guest's init reading
// commands.
const BootTimeout = 90 * time.Second

// readyLine is what the guest's init writes on the command port when it
// reads commands; rcPrefix starts the line that ends each command's output.
const (
	readyLine = "ESPD-XFRM-READY"
	rcPrefix  = "ESPD-XFRM-RC="
)

// Kernels are the kernel series build.sh builds a guest of, Debian 12's
// first (the one Build returns).
var Kernels = []string{"6.1", "6.12"}

// Image is a built guest: a kernel and its initramfs.
type Image struct {
	// Series is the kernel's series, one of Kernels.
	Series string
	// Dir is the cache directory that holds the files.
	Dir string
	// Kernel is the kernel image (vmlinuz).
	Kernel string
	// Initrd is the initramfs (gzip-compressed cpio).
	Initrd string
	// KernelVersion is the kernel's release (uname -r).
	KernelVersion string
}

// Available reports whether qemu can run here, and if not, why.
func Available() error {
	if _, err := exec.LookPath(QEMU); err != nil {
		return fmt.Errorf("xfrmguest: needs %s (apt-get install qemu-system-x86): %w", QEMU, err)
	}
	return nil
}

// Build returns the image of Debian 12's kernel, Kernels[0]: BuildKernel
// with that series.
func Build(ctx context.Context, script string) (Image, error) {
	return BuildKernel(ctx, script, Kernels[0])
}

// BuildKernel runs the build script (build.sh in this package's directory)
// for the kernel series, one of Kernels, which builds the image or finds it
// in its cache, and returns the image. An image that is not of that series
// is an error.
func BuildKernel(ctx context.Context, script, series string) (Image, error) {
	cmd := exec.CommandContext(ctx, "bash", script, series)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return Image{}, fmt.Errorf("xfrmguest: %s %s: %w: %s", script, series, err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := lines[len(lines)-1]
	kv, err := os.ReadFile(filepath.Join(dir, "kernel-version"))
	if err != nil {
		return Image{}, fmt.Errorf("xfrmguest: %s %s did not leave an image: %w", script, series, err)
	}
	img := Image{
		Series:        series,
		Dir:           dir,
		Kernel:        filepath.Join(dir, "vmlinuz"),
		Initrd:        filepath.Join(dir, "initrd.gz"),
		KernelVersion: strings.TrimSpace(string(kv)),
	}
	if s, err := os.ReadFile(filepath.Join(dir, "series")); err != nil || strings.TrimSpace(string(s)) != series {
		return Image{}, fmt.Errorf("xfrmguest: %s is not an image of kernel %s (series %q, %v)", dir, series, s, err)
	}
	for _, f := range []string{img.Kernel, img.Initrd} {
		if _, err := os.Stat(f); err != nil {
			return Image{}, fmt.Errorf("xfrmguest: image incomplete: %w", err)
		}
	}
	return img, nil
}

// Options configure a boot.
type Options struct {
	// Node is the namespace that holds the tap device and runs qemu.
	Node *testbed.Node
	// Tap is the name of the tap device Boot creates in Node (up, without
	// an address: the caller gives it one).
	Tap string
	// Addr is the guest's eth0 address with its prefix length, e.g.
	// "198.18.0.2/24".
	Addr string
	// Addr6, if set, is the guest's eth0 IPv6 address with its prefix
	// length, e.g. "2001:db8::2/64" (added without duplicate address
	// detection).
	Addr6 string
	// Files are extra files for the guest, each put at its key (an
	// absolute path in the guest) from its value (a file on this machine),
	// executable: Boot appends them to the image's initramfs as a second
	// archive, so programs built for a test need no image rebuild.
	Files map[string]string
	// MemoryMB is the guest's memory; 0 means DefaultMemoryMB.
	MemoryMB int
	// WorkDir receives qemu's log, the guest's console and the command
	// socket.
	WorkDir string
}

// DefaultMemoryMB is the guest's memory when Options.MemoryMB is 0.
const DefaultMemoryMB = 512

// Guest is a running guest.
type Guest struct {
	// Console is the file that receives the guest's kernel console.
	Console string
	// BootTime is how long the guest took from qemu's start to reading
	// commands.
	BootTime time.Duration

	proc *testbed.Process
	conn net.Conn
	rd   *bufio.Reader
	mu   sync.Mutex
}

// Boot creates the tap device, starts qemu in the namespace and waits, at
// most BootTimeout or until ctx ends, for the guest's init to read
// commands. The caller stops the guest with Close.
func Boot(ctx context.Context, img Image, o Options) (*Guest, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if _, err := o.Node.IP(ctx, "tuntap", "add", "dev", o.Tap, "mode", "tap"); err != nil {
		return nil, err
	}
	if _, err := o.Node.IP(ctx, "link", "set", o.Tap, "up"); err != nil {
		return nil, err
	}
	initrd := img.Initrd
	if len(o.Files) > 0 {
		var err error
		if initrd, err = qemuguest.AppendFiles(ctx, img.Initrd, o.Files, o.WorkDir); err != nil {
			return nil, err
		}
	}
	mem := o.MemoryMB
	if mem == 0 {
		mem = DefaultMemoryMB
	}
	cmdline := "console=ttyS0 quiet panic=-1 espd.addr=" + o.Addr
	if o.Addr6 != "" {
		cmdline += " espd.addr6=" + o.Addr6
	}
	sock := filepath.Join(o.WorkDir, "guest.sock")
	g := &Guest{Console: filepath.Join(o.WorkDir, "guest-console.log")}
	start := time.Now()
	// qemu waits for the command socket's client (wait=on) before it starts
	// the guest, so the guest's first line is never lost.
	proc, err := o.Node.Start(filepath.Join(o.WorkDir, "qemu.log"), QEMU,
		"-accel", "tcg", "-cpu", "max", "-smp", "1", "-m", strconv.Itoa(mem),
		"-nographic", "-no-reboot", "-monitor", "none",
		"-kernel", img.Kernel, "-initrd", initrd,
		"-append", cmdline,
		"-netdev", "tap,id=n0,ifname="+o.Tap+",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0",
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

// consoleTail returns the end of the guest's console.
func (g *Guest) consoleTail() string {
	b, _ := os.ReadFile(g.Console)
	return testbed.Tail(string(b), 15)
}

// readUntil reads lines until done returns true for one, which it returns
// with the lines before it; bounded by ctx (the connection's deadline).
func (g *Guest) readUntil(ctx context.Context, done func(string) bool) (string, []string, error) {
	if dl, ok := ctx.Deadline(); ok {
		g.conn.SetReadDeadline(dl)
	} else {
		g.conn.SetReadDeadline(time.Time{})
	}
	var before []string
	for {
		l, err := g.rd.ReadString('\n')
		l = strings.TrimRight(l, "\r\n")
		if err != nil {
			return "", before, err
		}
		if done(l) {
			return l, before, nil
		}
		before = append(before, l)
	}
}

// Run runs one shell command line in the guest (sh -c) and returns its
// combined output and exit status, bounded by ctx (30 s when ctx has no
// deadline). The command must be a single line; its stdin is /dev/null.
func (g *Guest) Run(ctx context.Context, cmd string) (string, int, error) {
	if strings.ContainsAny(cmd, "\r\n") {
		return "", 0, errors.New("xfrmguest: a command must be one line")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		g.conn.SetWriteDeadline(dl)
	}
	if _, err := g.conn.Write([]byte(cmd + "\n")); err != nil {
		return "", 0, fmt.Errorf("xfrmguest: send %q: %w", cmd, err)
	}
	last, out, err := g.readUntil(ctx, func(l string) bool { return strings.HasPrefix(l, rcPrefix) })
	if err != nil {
		return strings.Join(out, "\n"), 0, fmt.Errorf("xfrmguest: %q: %w", cmd, err)
	}
	rc, err := strconv.Atoi(strings.TrimPrefix(last, rcPrefix))
	if err != nil {
		return strings.Join(out, "\n"), 0, fmt.Errorf("xfrmguest: %q: bad status line %q", cmd, last)
	}
	return strings.Join(out, "\n"), rc, nil
}

// MustRun runs cmd with Run and returns its output; an error or a non-zero
// exit status is returned as an error naming the command and its output.
func (g *Guest) MustRun(ctx context.Context, cmd string) (string, error) {
	out, rc, err := g.Run(ctx, cmd)
	if err != nil {
		return out, err
	}
	if rc != 0 {
		return out, fmt.Errorf("xfrmguest: %q exited %d: %s", cmd, rc, out)
	}
	return out, nil
}

// Close stops qemu (SIGTERM, then SIGKILL) and closes the command socket.
func (g *Guest) Close() error {
	if g.conn != nil {
		g.conn.Close()
	}
	return g.proc.Stop(5 * time.Second)
}
