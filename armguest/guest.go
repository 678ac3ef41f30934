// Package armguest boots Debian's arm64 and armhf kernels under qemu's
// software emulation (TCG, the "virt" machine), with espd and an init
// cross-built for the guest's architecture, so that tests run espd's data
// path (its TUN, netlink and sockets, and its crypto in the architecture's
// own code) on ARM on a machine that is not. build.sh builds the kernels'
// images (a kernel and an initramfs of its modules); Boot adds the user
// space the test gives it (the init, cmd/guestinit, at /init; espd; its
// configuration) and attaches the guest's eth0 (virtio-net) to a tap device
// in a namespace of the caller's. The guest's console is a file the test
// reads; nothing else talks to it. Its figures measure nothing but
// function.
package armguest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/espd/espd/internal/qemuguest"
	"github.com/espd/espd/testbed"
)

// Arch is a guest architecture: its Debian name, the Go toolchain's
// settings that build for it, and how qemu runs it.
type Arch struct {
	// Name is the Debian architecture (dpkg --print-architecture).
	Name string
	// GOARCH and GOARM are the Go build's settings for it.
	GOARCH, GOARM string
	// QEMU is the qemu binary and CPU the guest runs on.
	QEMU, CPU string
}

// Archs are the architectures build.sh builds a guest of.
var Archs = []Arch{
	{Name: "arm64", GOARCH: "arm64", QEMU: "qemu-system-aarch64", CPU: "cortex-a57"},
	{Name: "armhf", GOARCH: "arm", GOARM: "7", QEMU: "qemu-system-arm", CPU: "cortex-a15"},
}

// BootTimeout bounds a boot, from qemu's start to the ready line.
const BootTimeout = 4 * time.Minute

// Available reports whether qemu can run a's guests here, and if not, why.
func Available(a Arch) error {
	if _, err := exec.LookPath(a.QEMU); err != nil {
		return fmt.Errorf("armguest: needs %s (apt-get install qemu-system-arm): %w", a.QEMU, err)
	}
	return nil
}

// GoBuild cross-builds the package pkg for a, statically (no cgo), into
// out, with testbed.BuildEnv's experiments, within ten minutes.
func GoBuild(ctx context.Context, a Arch, out, pkg string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Env = append(testbed.BuildEnv(), "GOOS=linux", "GOARCH="+a.GOARCH, "GOARM="+a.GOARM, "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("armguest: GOARCH=%s go build %s: %w\n%s", a.GOARCH, pkg, err, strings.TrimSpace(string(b)))
	}
	return nil
}

// Image is a built kernel and the initramfs of its modules.
type Image struct {
	Arch          Arch
	Kernel        string
	Initrd        string
	KernelVersion string
}

// Build runs the build script (build.sh in this package's directory) for
// a, which builds the image or finds it in its cache, and returns it.
func Build(ctx context.Context, script string, a Arch) (Image, error) {
	cmd := exec.CommandContext(ctx, "bash", script, a.Name)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return Image{}, fmt.Errorf("armguest: %s %s: %w: %s", script, a.Name, err, testbed.Tail(stderr.String(), 10))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := lines[len(lines)-1]
	if b, err := os.ReadFile(filepath.Join(dir, "arch")); err != nil || strings.TrimSpace(string(b)) != a.Name {
		return Image{}, fmt.Errorf("armguest: %s is not an image for %s (%q, %v)", dir, a.Name, b, err)
	}
	kv, err := os.ReadFile(filepath.Join(dir, "kernel-version"))
	if err != nil {
		return Image{}, err
	}
	img := Image{Arch: a, Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.gz"),
		KernelVersion: strings.TrimSpace(string(kv))}
	for _, f := range []string{img.Kernel, img.Initrd} {
		if _, err := os.Stat(f); err != nil {
			return Image{}, fmt.Errorf("armguest: image incomplete: %w", err)
		}
	}
	return img, nil
}

// Options configure a boot.
type Options struct {
	// Node holds the tap device and runs qemu.
	Node *testbed.Node
	// Tap is the tap device Boot creates in Node, up, without an address.
	Tap string
	// Args are the kernel command line's words for the init, such as
	// "armguest.addr=198.18.0.2/24".
	Args []string
	// Files are the guest's user space: guest path -> file here (at least
	// /init), added to the image's initramfs.
	Files map[string]string
	// WorkDir receives qemu's log, the console and the initramfs.
	WorkDir string
}

// Guest is a running guest.
type Guest struct {
	// Console is the file that receives the guest's console.
	Console string
	proc    *testbed.Process
}

// Boot creates the tap device and starts qemu in the namespace with one
// vCPU and 512 MB; it does not wait for the guest (WaitConsole does). The
// caller stops the guest with Close.
func Boot(ctx context.Context, img Image, o Options) (*Guest, error) {
	a := img.Arch
	if err := Available(a); err != nil {
		return nil, err
	}
	if _, err := o.Node.IP(ctx, "tuntap", "add", "dev", o.Tap, "mode", "tap"); err != nil {
		return nil, err
	}
	if _, err := o.Node.IP(ctx, "link", "set", o.Tap, "up"); err != nil {
		return nil, err
	}
	initrd, err := qemuguest.AppendFiles(ctx, img.Initrd, o.Files, o.WorkDir)
	if err != nil {
		return nil, err
	}
	g := &Guest{Console: filepath.Join(o.WorkDir, "console.log")}
	cmdline := "console=ttyAMA0 panic=-1 " + strings.Join(o.Args, " ")
	g.proc, err = o.Node.Start(filepath.Join(o.WorkDir, "qemu.log"), a.QEMU,
		"-M", "virt", "-accel", "tcg", "-cpu", a.CPU, "-smp", "1", "-m", "512",
		"-nographic", "-no-reboot", "-monitor", "none",
		"-kernel", img.Kernel, "-initrd", initrd, "-append", cmdline,
		"-netdev", "tap,id=n0,ifname="+o.Tap+",script=no,downscript=no",
		"-device", "virtio-net-device,netdev=n0",
		"-device", "virtio-rng-device",
		"-serial", "file:"+g.Console)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// WaitConsole waits until a line of the console starts with one of
// prefixes, polling every 100 ms, and returns that line; it fails when qemu
// exits first or ctx ends.
func (g *Guest) WaitConsole(ctx context.Context, prefixes ...string) (string, error) {
	for {
		b, _ := os.ReadFile(g.Console)
		for _, l := range strings.Split(string(b), "\n") {
			l = strings.TrimRight(l, "\r")
			for _, p := range prefixes {
				if strings.HasPrefix(l, p) {
					return l, nil
				}
			}
		}
		select {
		case <-g.proc.Done():
			return "", fmt.Errorf("armguest: qemu exited: %s; console: %s", testbed.Tail(g.proc.Log(), 5), g.ConsoleTail(15))
		case <-ctx.Done():
			return "", fmt.Errorf("armguest: no %q on the console: %w; console: %s", prefixes, ctx.Err(), g.ConsoleTail(15))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ConsoleTail returns the last n lines of the console.
func (g *Guest) ConsoleTail(n int) string {
	b, _ := os.ReadFile(g.Console)
	return testbed.Tail(string(b), n)
}

// Close stops qemu (SIGTERM, then SIGKILL).
func (g *Guest) Close() error { return g.proc.Stop(5 * time.Second) }
