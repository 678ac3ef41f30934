// Command guestinit is the init (PID 1) of armguest's guests, cross-built
// with espd for the guest's architecture: it mounts the kernel's file
// systems, loads the modules that armguest/build.sh put in the initramfs
// (/lib/modules/modules.order), gives eth0 the address of the kernel
// command line's armguest.addr and lo the one of armguest.inner, serves
// TCP echo on armguest.inner's guestproto.EchoPort, and runs espd with the
// configuration the test put at /etc/espd/espd.conf, its log on the
// console. It writes guestproto.ReadyLine on the console once espd is ready
// (its control socket accepts connections and its TUN is up), and
// guestproto.DoneLine (with espd's exit status) when espd has exited; then it powers
// the guest off.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/espd/espd/armguest/guestproto"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// espd's TUN and control socket in the guest.
const (
	tunName       = "espd0"
	controlSocket = "/run/espd.sock"
)

func main() {
	err := run()
	if err != nil {
		fmt.Printf("guestinit: %v\n", err)
	}
	fmt.Printf("%s %v\n", guestproto.DoneLine, err)
	unix.Sync()
	// PID 1 must not exit: power off instead (qemu -no-reboot ends).
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}

func run() error {
	for _, m := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/tmp", "tmpfs"}, {"tmpfs", "/run", "tmpfs"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fs, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if err := loadModules("/lib/modules"); err != nil {
		return err
	}
	args, err := cmdline()
	if err != nil {
		return err
	}
	if err := network(args["armguest.addr"], args["armguest.inner"]); err != nil {
		return err
	}
	inner, err := netip.ParsePrefix(args["armguest.inner"])
	if err != nil {
		return fmt.Errorf("armguest.inner: %w", err)
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(inner.Addr(), guestproto.EchoPort).String())
	if err != nil {
		return err
	}
	go echo(ln)

	cmd := exec.Command("/bin/espd", "--config", "/etc/espd/espd.conf", "--tun", tunName,
		"--state-dir", "/var/lib/espd", "--socket", controlSocket, "--no-ipv6")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// espd ready within 120 s (emulated, the first start is slow): its
	// control socket, which it opens last, after its outer sockets and the
	// configuration's states, accepts a connection, and its TUN is up.
	deadline := time.After(120 * time.Second)
	for {
		if ready() {
			break
		}
		select {
		case err := <-exited:
			return fmt.Errorf("espd exited before it was ready: %v", err)
		case <-deadline:
			_ = cmd.Process.Kill()
			return errors.New("espd not ready (control socket, TUN) after 120 s")
		case <-time.After(100 * time.Millisecond):
		}
	}
	fmt.Println(guestproto.ReadyLine)
	if err := <-exited; err != nil {
		return fmt.Errorf("espd: %w", err)
	}
	return nil
}

// ready reports whether espd's control socket accepts a connection and its
// TUN is up.
func ready() bool {
	c, err := net.DialTimeout("unix", controlSocket, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	l, err := netlink.LinkByName(tunName)
	return err == nil && l.Attrs().Flags&net.FlagUp != 0
}

// loadModules loads the modules listed in dir/modules.order, in order; one
// the kernel already has is not an error.
func loadModules(dir string) error {
	f, err := os.Open(filepath.Join(dir, "modules.order"))
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" {
			continue
		}
		ko, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(ko.Fd()), "", 0)
		ko.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return sc.Err()
}

// cmdline returns the kernel command line's key=value words.
func cmdline() (map[string]string, error) {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return nil, err
	}
	args := map[string]string{}
	for _, w := range strings.Fields(string(b)) {
		if k, v, ok := strings.Cut(w, "="); ok {
			args[k] = v
		}
	}
	return args, nil
}

// network brings lo and eth0 up, eth0 with addr and lo with inner (both
// with their prefix length), waiting up to 30 s for eth0 to appear.
func network(addr, inner string) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	var eth netlink.Link
	for i := 0; ; i++ {
		if eth, err = netlink.LinkByName("eth0"); err == nil {
			break
		}
		if i == 300 {
			return fmt.Errorf("no eth0 after 30 s: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, a := range []struct {
		l netlink.Link
		p string
	}{{eth, addr}, {lo, inner}} {
		na, err := netlink.ParseAddr(a.p)
		if err != nil {
			return fmt.Errorf("address %q: %w", a.p, err)
		}
		if err := netlink.AddrAdd(a.l, na); err != nil {
			return fmt.Errorf("address %s on %s: %w", a.p, a.l.Attrs().Name, err)
		}
	}
	return netlink.LinkSetUp(eth)
}

// echo serves TCP echo: each connection gets back what it sends, until it
// closes its side.
func echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
			_ = c.(*net.TCPConn).CloseWrite()
		}()
	}
}
