package routing_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/espd/espd/routing"
	"github.com/espd/espd/testbed"
)

const table = 0xe5d1

// env is a namespace with a persistent TUN "tun0" standing in for espd's
// and a veth "out0" (198.18.0.1/16, 2001:db8::1/64, MTU 1480) for the outer
// interface the main table routes to.
type env struct {
	ns    *testbed.Node
	index int
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ns := testbed.NewNodeT(t, "rt")
	ns.MustIP(t, "tuntap", "add", "mode", "tun", "name", "tun0")
	ns.MustIP(t, "link", "set", "tun0", "up")
	ns.MustIP(t, "link", "add", "name", "out0", "mtu", "1480", "type", "veth", "peer", "name", "peer0")
	ns.MustIP(t, "link", "set", "peer0", "up")
	ns.MustIP(t, "link", "set", "out0", "up")
	ns.MustIP(t, "addr", "add", "198.18.0.1/16", "dev", "out0")
	ns.MustIP(t, "-6", "addr", "add", "2001:db8::1/64", "dev", "out0", "nodad")
	e := &env{ns: ns}
	err := ns.Do(func() error {
		l, err := netlink.LinkByName("tun0")
		if err == nil {
			e.index = l.Attrs().Index
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) router(t *testing.T, cfg routing.Config) *routing.Router {
	t.Helper()
	cfg.LinkIndex, cfg.LinkName = e.index, "tun0"
	if cfg.Table == 0 {
		cfg.Table = table
	}
	var r *routing.Router
	err := e.ns.Do(func() (err error) {
		r, err = routing.New(cfg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// dev returns the device "ip route get" picks for dst, with mark if != 0.
func (e *env) dev(t *testing.T, dst string, mark uint32) string {
	t.Helper()
	return e.routeGet(t, dst, mark)
}

// devFrom returns the device "ip route get" picks for a packet from src
// to dst that arrives on lan0 (forwarded), with mark if != 0: lan(t)
// first.
func (e *env) devFrom(t *testing.T, dst, src string, mark uint32) string {
	t.Helper()
	return e.routeGet(t, dst, mark, "from", src, "iif", "lan0")
}

func (e *env) routeGet(t *testing.T, dst string, mark uint32, more ...string) string {
	t.Helper()
	args := append([]string{"-o", "route", "get", dst}, more...)
	if mark != 0 {
		args = append(args, "mark", strconv.FormatUint(uint64(mark), 10))
	}
	out, err := e.ns.IP(context.Background(), args...)
	if err != nil {
		// A blackhole route answers EINVAL, no route ENETUNREACH.
		if strings.Contains(out, "Invalid argument") {
			return "blackhole"
		}
		return "unreachable"
	}
	f := strings.Fields(out)
	if len(f) > 0 && f[0] == "blackhole" {
		return "blackhole"
	}
	for i := range f[:len(f)-1] {
		if f[i] == "dev" {
			return f[i+1]
		}
	}
	return "?" + out
}

// lan gives the namespace a LAN on lan0 (198.18.1.1/24, 2001:db8:1::1/64)
// and forwarding, as a gateway has: devFrom asks for packets from the LAN
// and elsewhere.
func (e *env) lan(t *testing.T) {
	t.Helper()
	e.ns.MustIP(t, "link", "add", "name", "lan0", "type", "veth", "peer", "name", "lanpeer0")
	e.ns.MustIP(t, "link", "set", "lanpeer0", "up")
	e.ns.MustIP(t, "link", "set", "lan0", "up")
	e.ns.MustIP(t, "addr", "add", "198.18.1.1/24", "dev", "lan0")
	e.ns.MustIP(t, "-6", "addr", "add", "2001:db8:1::1/64", "dev", "lan0", "nodad")
	err := e.ns.Do(func() error {
		for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding",
			"/proc/sys/net/ipv4/conf/all/rp_filter", "/proc/sys/net/ipv4/conf/lan0/rp_filter"} {
			v := "1"
			if strings.HasSuffix(f, "rp_filter") {
				v = "0"
			}
			if err := os.WriteFile(f, []byte(v), 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// anyFrom is the source of a policy without one: every address of p's
// family.
func anyFrom(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4() {
		return netip.MustParsePrefix("0.0.0.0/0")
	}
	return netip.MustParsePrefix("::/0")
}

// mustAdd adds a reference to p from any source.
func mustAdd(t *testing.T, r *routing.Router, p string, k routing.Kind) {
	t.Helper()
	dst := netip.MustParsePrefix(p)
	mustAddFrom(t, r, anyFrom(dst).String(), p, k)
}

func mustRemove(t *testing.T, r *routing.Router, p string, k routing.Kind) {
	t.Helper()
	dst := netip.MustParsePrefix(p)
	mustRemoveFrom(t, r, anyFrom(dst).String(), p, k)
}

func mustAddFrom(t *testing.T, r *routing.Router, src, dst string, k routing.Kind) {
	t.Helper()
	if err := r.AddRoute(netip.MustParsePrefix(src), netip.MustParsePrefix(dst), k); err != nil {
		t.Fatal(err)
	}
}

func mustRemoveFrom(t *testing.T, r *routing.Router, src, dst string, k routing.Kind) {
	t.Helper()
	if err := r.RemoveRoute(netip.MustParsePrefix(src), netip.MustParsePrefix(dst), k); err != nil {
		t.Fatal(err)
	}
}

// TestRulesAndRPFilter: New adds no rule; a reference from the /0 source
// adds the rule espd always had (no source, every unmarked packet), and no
// mark rules; the last reference removes it.
func TestRulesAndRPFilter(t *testing.T) {
	e := newEnv(t)
	r := e.router(t, routing.Config{Mark: 0x100, Mask: 0xf00, Priority: 4242})
	if r.Table() != table || r.Mark() != 0x100 {
		t.Fatalf("table %d mark %#x", r.Table(), r.Mark())
	}
	for _, fam := range []string{"-4", "-6"} {
		if out := e.ns.MustIP(t, fam, "rule", "show"); strings.Contains(out, "424") {
			t.Errorf("%s: rules after New, with nothing referenced:\n%s", fam, out)
		}
	}
	mustAdd(t, r, "198.18.5.0/24", routing.Tunnel)
	mustAdd(t, r, "2001:db8:5::/48", routing.Tunnel)
	for _, fam := range []string{"-4", "-6"} {
		out := e.ns.MustIP(t, fam, "rule", "show")
		want := "4242:\tnot from all fwmark 0x100/0xf00 lookup " + strconv.Itoa(table)
		if !strings.Contains(out, want) {
			t.Errorf("%s rules lack %q:\n%s", fam, want, out)
		}
		if strings.Contains(out, "4241:") || strings.Contains(out, "4243:") {
			t.Errorf("%s: mark rules for the /0 source, which needs none:\n%s", fam, out)
		}
	}
	var rp string
	e.ns.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/conf/tun0/rp_filter")
		rp = strings.TrimSpace(string(b))
		return err
	})
	if rp != "2" {
		t.Errorf("rp_filter on tun0 = %q, want 2", rp)
	}
	mustRemove(t, r, "198.18.5.0/24", routing.Tunnel)
	mustRemove(t, r, "2001:db8:5::/48", routing.Tunnel)
	for _, fam := range []string{"-4", "-6"} {
		if out := e.ns.MustIP(t, fam, "rule", "show"); strings.Contains(out, "4242:") {
			t.Errorf("%s rule left after the last reference:\n%s", fam, out)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.AddRoute(netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("198.18.5.0/24"), routing.Tunnel); err == nil {
		t.Error("AddRoute after Close succeeded")
	}
}

// TestDefaultRouteDoesNotCatchMarked covers 0.0.0.0/0 and ::/0 through the
// TUN: unmarked traffic, the peer's address included, goes to the TUN;
// marked traffic (espd's outer packets) keeps using the main table.
func TestDefaultRouteDoesNotCatchMarked(t *testing.T) {
	e := newEnv(t)
	r := e.router(t, routing.Config{})
	mustAdd(t, r, "0.0.0.0/0", routing.Tunnel)
	mustAdd(t, r, "::/0", routing.Tunnel)
	for _, dst := range []string{"198.18.0.2", "2001:db8::2", "198.19.7.7", "2001:db8:1::9"} {
		if got := e.dev(t, dst, 0); got != "tun0" {
			t.Errorf("unmarked %s via %s, want tun0", dst, got)
		}
	}
	for _, dst := range []string{"198.18.0.2", "2001:db8::2"} {
		if got := e.dev(t, dst, routing.DefaultMark); got != "out0" {
			t.Errorf("marked %s via %s, want out0", dst, got)
		}
	}
	if got := e.dev(t, "198.19.7.7", routing.DefaultMark); got != "unreachable" {
		t.Errorf("marked 198.19.7.7 via %s, want no route (main table has none)", got)
	}
	mtu, err := r.PathMTU(netip.MustParseAddr("198.18.0.2"))
	if err != nil || mtu != 1480 {
		t.Errorf("PathMTU = %d, %v; want 1480", mtu, err)
	}
	e.ns.MustIP(t, "route", "add", "198.18.9.0/24", "dev", "out0", "mtu", "1300")
	mtu, err = r.PathMTU(netip.MustParseAddr("198.18.9.9"))
	if err != nil || mtu != 1300 {
		t.Errorf("PathMTU via route mtu = %d, %v; want 1300", mtu, err)
	}
	mtu, err = r.PathMTU(netip.MustParseAddr("2001:db8::77"))
	if err != nil || mtu != 1480 {
		t.Errorf("PathMTU IPv6 = %d, %v; want 1480", mtu, err)
	}
}

func TestThrowFallsBackToMain(t *testing.T) {
	e := newEnv(t)
	r := e.router(t, routing.Config{})
	mustAdd(t, r, "198.18.0.0/16", routing.Tunnel)
	mustAdd(t, r, "198.18.0.0/24", routing.Throw)
	mustAdd(t, r, "2001:db8::/32", routing.Tunnel)
	mustAdd(t, r, "2001:db8::/64", routing.Throw)
	for dst, want := range map[string]string{
		"198.18.0.9": "out0", "198.18.1.9": "tun0",
		"2001:db8::9": "out0", "2001:db8:0:1::9": "tun0",
	} {
		if got := e.dev(t, dst, 0); got != want {
			t.Errorf("%s via %s, want %s", dst, got, want)
		}
	}
	out := e.ns.MustIP(t, "route", "show", "table", strconv.Itoa(table))
	if !strings.Contains(out, "throw 198.18.0.0/24 proto 229") {
		t.Errorf("table lacks the throw route:\n%s", out)
	}
}

func TestRefcountAndSharedPrefix(t *testing.T) {
	e := newEnv(t)
	r := e.router(t, routing.Config{})
	const p = "198.18.40.0/24"
	mustAdd(t, r, p, routing.Tunnel)
	mustAdd(t, r, "198.18.40.7/24", routing.Tunnel) // same prefix once masked
	mustRemove(t, r, p, routing.Tunnel)
	if got := e.dev(t, "198.18.40.1", 0); got != "tun0" {
		t.Fatalf("route gone with a reference left: via %s", got)
	}
	// A bypass policy sharing the prefix does not open a hole.
	mustAdd(t, r, p, routing.Throw)
	if got := e.dev(t, "198.18.40.1", 0); got != "tun0" {
		t.Fatalf("throw displaced the tunnel route: via %s", got)
	}
	mustRemove(t, r, p, routing.Tunnel)
	if got := e.dev(t, "198.18.40.1", 0); got != "out0" {
		t.Fatalf("after the last tunnel reference: via %s, want out0 (throw)", got)
	}
	if rs := r.Routes(); len(rs) != 1 || rs[0].Installed != routing.Throw || rs[0].Throws != 1 || rs[0].Tunnel != 0 {
		t.Fatalf("Routes() = %+v", rs)
	}
	mustRemove(t, r, p, routing.Throw)
	if err := r.RemoveRoute(netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix(p), routing.Throw); err == nil {
		t.Error("removing an unreferenced route succeeded")
	}
	if out := e.ns.MustIP(t, "route", "show", "table", "all", "proto", "229"); strings.TrimSpace(out) != "" {
		t.Errorf("routes left:\n%s", out)
	}
	if len(r.Routes()) != 0 {
		t.Errorf("Routes() = %+v after removing all", r.Routes())
	}
}

func TestNewFailureLeavesNothing(t *testing.T) {
	e := newEnv(t)
	err := e.ns.Do(func() error {
		r, err := routing.New(routing.Config{LinkIndex: e.index, LinkName: "nosuch0", Table: table})
		if err == nil {
			r.Close()
		}
		return err
	})
	if err == nil {
		t.Fatal("New succeeded with a link name that does not exist")
	}
	for _, fam := range []string{"-4", "-6"} {
		if out := e.ns.MustIP(t, fam, "rule", "show"); strings.Contains(out, "lookup "+strconv.Itoa(table)) {
			t.Errorf("%s rule left after failed New:\n%s", fam, out)
		}
	}
	for _, bad := range []routing.Config{
		{LinkIndex: e.index, LinkName: "tun0", Table: 254},
		{LinkIndex: e.index, LinkName: "tun0", Mark: 0x11, Mask: 0x10},
		{LinkName: "tun0"},
	} {
		if r, err := routing.New(bad); err == nil {
			r.Close()
			t.Errorf("New(%+v) succeeded", bad)
		}
	}
}

func TestNoIPv6(t *testing.T) {
	e := newEnv(t)
	r := e.router(t, routing.Config{NoIPv6: true})
	if err := r.AddRoute(netip.MustParsePrefix("::/0"), netip.MustParsePrefix("2001:db8::/32"), routing.Tunnel); err == nil {
		t.Error("IPv6 prefix accepted with NoIPv6")
	}
	if out := e.ns.MustIP(t, "-6", "rule", "show"); strings.Contains(out, "lookup "+strconv.Itoa(table)) {
		t.Errorf("IPv6 rule added with NoIPv6:\n%s", out)
	}
}

// TestPathMTUDuringClose asks for path MTUs while the router closes (the
// data plane's refresher does so at shutdown): under -race, no race on the
// netlink handle; after Close, PathMTU fails instead of using it.
func TestPathMTUDuringClose(t *testing.T) {
	e := newEnv(t)
	r := e.router(t, routing.Config{})
	dst := netip.MustParseAddr("198.18.0.2")
	var ok atomic.Uint64
	errc := make(chan error, 2)
	for range 2 {
		go func() {
			for range 1_000_000 {
				if _, err := r.PathMTU(dst); err != nil {
					errc <- err
					return
				}
				ok.Add(1)
			}
			errc <- errors.New("PathMTU kept working through Close")
		}()
	}
	deadline := time.Now().Add(time.Minute)
	for ok.Load() < 10 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	for range 2 {
		if err := <-errc; !errors.Is(err, routing.ErrClosed) {
			t.Errorf("PathMTU after Close: %v, want the router closed", err)
		}
	}
	if _, err := r.PathMTU(dst); !errors.Is(err, routing.ErrClosed) {
		t.Errorf("PathMTU after Close: %v, want ErrClosed", err)
	}
}
