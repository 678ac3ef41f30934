package routing_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/routing"
)

// tunReader attaches to tun0 (so that its carrier is up) and returns the
// fd the host's packets to it are read from, closed with the test.
func (e *env) tunReader(t *testing.T) int {
	t.Helper()
	var fd int
	err := e.ns.Do(func() error {
		var err error
		if fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err != nil {
			return err
		}
		ifr, err := unix.NewIfreq("tun0")
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	// The carrier comes up at once, but the kernel activates the queue
	// (until then "qdisc noop" drops every packet) from its link-watch
	// work, later: wait for it.
	for deadline := time.Now().Add(20 * time.Second); ; {
		out := e.ns.MustIP(t, "-o", "link", "show", "tun0")
		if strings.Contains(out, "state UP") && !strings.Contains(out, "qdisc noop") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tun0 not up with a queue:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fd
}

// sendUDP sends one datagram of n bytes from the namespace to dst:9 and
// returns the sizes of the packets the host routed into the TUN for it.
func (e *env) sendUDP(t *testing.T, fd int, dst string, n int) []int {
	t.Helper()
	err := e.ns.Do(func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(dst), 9)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(make([]byte, n))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	buf := make([]byte, 65536)
	total := 0
	deadline := time.Now().Add(10 * time.Second)
	for total < n+8 && time.Now().Before(deadline) { // until the UDP datagram is all in
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		unix.Poll(pfd, 100)
		k, err := unix.Read(fd, buf)
		if err != nil {
			continue
		}
		if buf[0]>>4 == 6 && k > 40 && buf[6] == 58 {
			continue // ICMPv6 (router solicitations, MLD)
		}
		sizes = append(sizes, k)
		total += k - 20 // IPv4 header
		if buf[0]>>4 == 6 {
			total -= 20 // IPv6 header, 40
		}
	}
	return sizes
}

// TestTransportRoute: a Transport reference routes its prefix into the
// TUN with a locked MTU and an advertised MSS, so that the host's own
// 9,216-byte datagram reaches the TUN whole (a Tunnel route hands it over
// in TUN-sized fragments); the attributes come and go with the Transport
// references, in place, and the prefix stays held throughout.
func TestTransportRoute(t *testing.T) {
	e := newEnv(t)
	r := e.router(t, routing.Config{MTU: 1400, TransportMTU: 16000})
	e.ns.MustIP(t, "link", "set", "tun0", "mtu", "1400")
	ctx := context.Background()
	show := func(p string) string {
		t.Helper()
		args := []string{"route", "show", "table", strconv.Itoa(table), p}
		if strings.Contains(p, ":") {
			args = append([]string{"-6"}, args...)
		}
		out, err := e.ns.IP(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// An address on lo, which the host would pick as the source of its
	// packets into the TUN (which has none) if the route did not name one.
	e.ns.MustIP(t, "addr", "add", "198.18.5.5/32", "dev", "lo")
	const host4, host6 = "198.18.0.9/32", "2001:db8::9/128"
	mustAddFrom(t, r, "198.18.0.1/32", host4, routing.Transport)
	mustAddFrom(t, r, "2001:db8::1/128", host6, routing.Transport)
	for _, c := range []struct{ p, mss, src string }{{host4, "advmss 1360", "src 198.18.0.1 "}, {host6, "advmss 1340", "src 2001:db8::1 "}} {
		out := show(c.p)
		if !strings.Contains(out, "dev tun0") || !strings.Contains(out, "mtu lock 16000") || !strings.Contains(out, c.mss) || !strings.Contains(out, c.src) {
			t.Errorf("%s: route\n%s\nwant dev tun0, mtu lock 16000, %s, %s", c.p, out, c.mss, c.src)
		}
		got := e.ns.MustIP(t, "route", "get", strings.Split(c.p, "/")[0])
		if !strings.Contains(got, c.src) {
			t.Errorf("route get %s:\n%s\nwant %s", c.p, got, c.src)
		}
	}
	// The address goes (the kernel deletes the IPv4 route that names it)
	// and comes back: the route is back at once without the source,
	// then with it.
	e.ns.MustIP(t, "addr", "del", "198.18.0.1/16", "dev", "out0")
	waitRoute := func(want func(string) bool, what string) {
		t.Helper()
		var out string
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if out = show(host4); want(out) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s:\n%s", what, out)
			}
		}
	}
	waitRoute(func(out string) bool {
		return strings.Contains(out, "dev tun0") && strings.Contains(out, "mtu lock 16000") && !strings.Contains(out, " src ")
	}, "no transport route without its source once the address went")
	e.ns.MustIP(t, "addr", "add", "198.18.0.1/16", "dev", "out0")
	waitRoute(func(out string) bool { return strings.Contains(out, "src 198.18.0.1 ") }, "the source not back with the address")

	// A source the host does not hold: the route goes in without one.
	mustAddFrom(t, r, "198.18.9.9/32", "198.18.0.10/32", routing.Transport)
	if out := show("198.18.0.10/32"); !strings.Contains(out, "mtu lock 16000") || strings.Contains(out, " src ") {
		t.Errorf("route with a foreign source\n%s", out)
	}
	mustRemoveFrom(t, r, "198.18.9.9/32", "198.18.0.10/32", routing.Transport)

	// The host's own big datagram goes to the TUN whole.
	fd := e.tunReader(t)
	if got := e.sendUDP(t, fd, "198.18.0.9", 9216); len(got) != 1 || got[0] != 9216+28 {
		t.Errorf("9216-byte datagram over the transport route reached the TUN as %v", got)
	}
	if got := e.sendUDP(t, fd, "2001:db8::9", 9216); len(got) != 1 || got[0] != 9216+48 {
		t.Errorf("9216-byte IPv6 datagram over the transport route reached the TUN as %v", got)
	}

	// A Tunnel reference beside it; the Transport one goes: the same
	// route without the attributes, and the datagram in fragments.
	mustAddFrom(t, r, "198.18.0.1/32", host4, routing.Tunnel)
	if err := r.RemoveRoute(netip.MustParsePrefix("198.18.0.1/32"), netip.MustParsePrefix(host4), routing.Transport); err != nil {
		t.Fatal(err)
	}
	if out := show(host4); !strings.Contains(out, "dev tun0") || strings.Contains(out, "mtu") || strings.Contains(out, "advmss") || strings.Contains(out, " src ") {
		t.Errorf("tunnel route left\n%s", out)
	}
	if got := e.sendUDP(t, fd, "198.18.0.9", 9216); len(got) != 7 {
		t.Errorf("9216-byte datagram over a tunnel route reached the TUN as %v, want 7 fragments", got)
	}
	if err := r.RemoveRoute(netip.MustParsePrefix("198.18.0.1/32"), netip.MustParsePrefix(host4), routing.Transport); err == nil {
		t.Error("removed a Transport reference that is not there")
	}

	// Back to transport, then the last reference goes: route and hold.
	mustAddFrom(t, r, "198.18.0.1/32", host4, routing.Transport)
	if out := show(host4); !strings.Contains(out, "mtu lock 16000") || !strings.Contains(out, "src 198.18.0.1 ") {
		t.Errorf("transport attributes not back\n%s", out)
	}
	mustRemoveFrom(t, r, "198.18.0.1/32", host4, routing.Tunnel)
	if out := show(host4); !strings.Contains(out, "mtu lock 16000") || !strings.Contains(out, "blackhole") {
		t.Errorf("after the tunnel reference went\n%s", out)
	}
	mustRemoveFrom(t, r, "198.18.0.1/32", host4, routing.Transport)
	mustRemoveFrom(t, r, "2001:db8::1/128", host6, routing.Transport)
	if out := e.ns.MustIP(t, "route", "show", "table", "all", "proto", "229"); strings.TrimSpace(out) != "" {
		t.Errorf("routes left:\n%s", out)
	}
}

// TestTransportConfig: the MTUs are checked.
func TestTransportConfig(t *testing.T) {
	e := newEnv(t)
	for _, cfg := range []routing.Config{{MTU: 500}, {MTU: 1400, TransportMTU: 1300}, {TransportMTU: 70000}} {
		cfg.LinkIndex, cfg.LinkName, cfg.Table = e.index, "tun0", table
		err := e.ns.Do(func() error {
			r, err := routing.New(cfg)
			if err == nil {
				r.Close()
			}
			return err
		})
		if err == nil {
			t.Errorf("New(%+v) took it", cfg)
		}
	}
}

// TestStrictRPFilter: the filter of the interface to a peer is strict
// when the larger of "all" and the interface's own rp_filter is 1.
func TestStrictRPFilter(t *testing.T) {
	e := newEnv(t)
	r := e.router(t, routing.Config{})
	for _, c := range []struct {
		all, dev string
		strict   bool
	}{{"0", "0", false}, {"1", "0", true}, {"0", "1", true}, {"1", "2", false}, {"2", "1", false}} {
		var dev string
		var strict bool
		err := e.ns.Do(func() error {
			for k, v := range map[string]string{"all": c.all, "out0": c.dev} {
				if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+k+"/rp_filter", []byte(v), 0o644); err != nil {
					return err
				}
			}
			var err error
			dev, strict, err = r.StrictRPFilter(netip.MustParseAddr("198.18.0.2"))
			return err
		})
		if err != nil || dev != "out0" || strict != c.strict {
			t.Errorf("all=%s out0=%s: %q, %v, %v; want out0, %v", c.all, c.dev, dev, strict, err, c.strict)
		}
	}
	if _, strict, err := r.StrictRPFilter(netip.MustParseAddr("2001:db8::2")); strict || err != nil {
		t.Errorf("IPv6: %v, %v", strict, err)
	}
}
