// Package netnstest creates throw-away network namespaces for the tests of
// espd's kernel-facing packages (tun, routing, dataplane).
//
// Every namespace gets a unique name, is deleted by t.Cleanup even when the
// test fails, and starts with only the loopback interface, up. Tests address
// things inside it only with 198.18.0.0/15 and 2001:db8::/32.
package netnstest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

var seq atomic.Uint32

// NS is a named network namespace owned by one test.
type NS struct {
	// Name is the namespace's name under /var/run/netns, usable with ip -n.
	Name   string
	handle netns.NsHandle
}

// Root reports whether the process may create namespaces and TUN devices.
// Tests call it to skip, with a reason, when they cannot run at all.
func Root() (bool, string) {
	if os.Geteuid() != 0 {
		return false, "needs root for network namespaces"
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return false, "needs /dev/net/tun"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return false, "needs iproute2 (ip)"
	}
	return true, ""
}

// New creates a namespace named after prefix, brings its loopback up and
// registers its deletion with t.Cleanup.
func New(t testing.TB, prefix string) *NS {
	t.Helper()
	if ok, why := Root(); !ok {
		t.Skip(why)
	}
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1))
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	h, err := create(name)
	if err != nil {
		t.Fatalf("create netns %s: %v", name, err)
	}
	ns := &NS{Name: name, handle: h}
	t.Cleanup(func() {
		h.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	ns.IP(t, "link", "set", "lo", "up")
	return ns
}

// create makes the named namespace from a locked thread and switches the
// thread back before unlocking it.
func create(name string) (netns.NsHandle, error) {
	type result struct {
		h   netns.NsHandle
		err error
	}
	c := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			c <- result{err: err}
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if restore := netns.Set(orig); restore == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and exits with this goroutine
		c <- result{h, err}
	}()
	r := <-c
	return r.h, r.err
}

// Do runs fn on an OS thread switched into the namespace. Sockets, TUN
// devices and netlink handles that fn creates belong to the namespace and
// stay there; goroutines fn starts run outside it.
func (ns *NS) Do(fn func() error) error {
	c := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			c <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns.handle); err != nil {
			runtime.UnlockOSThread()
			c <- fmt.Errorf("enter netns %s: %w", ns.Name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread()
		}
		c <- ferr
	}()
	return <-c
}

// Handle returns the namespace's handle (for netlink.NewHandleAt).
func (ns *NS) Handle() netns.NsHandle { return ns.handle }

// IP runs "ip -n <ns> args..." and fails the test on error. It returns the
// command's output.
func (ns *NS) IP(t testing.TB, args ...string) string {
	t.Helper()
	out, err := ns.TryIP(args...)
	if err != nil {
		t.Fatalf("ip -n %s %s: %v", ns.Name, strings.Join(args, " "), err)
	}
	return out
}

// TryIP runs "ip -n <ns> args..." with a 10 s bound and returns its output
// and error.
func (ns *NS) TryIP(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"-n", ns.Name}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Sysctl writes value to /proc/sys/<key> (key with slashes) inside the
// namespace.
func (ns *NS) Sysctl(key, value string) error {
	return ns.Do(func() error {
		return os.WriteFile("/proc/sys/"+key, []byte(value), 0)
	})
}

// Veth creates a veth pair between a (name an) and b (name bn) and brings
// both ends up. The pair disappears with either namespace.
func Veth(t testing.TB, a *NS, an string, b *NS, bn string) {
	t.Helper()
	a.IP(t, "link", "add", "name", an, "type", "veth", "peer", "name", bn, "netns", b.Name)
	a.IP(t, "link", "set", an, "up")
	b.IP(t, "link", "set", bn, "up")
}
