package routing_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/espd/espd/routing"
)

// defaultRoutes gives the namespace's main table default routes through
// out0, as every real gateway has: a packet that falls through espd's table
// leaves in clear on out0.
func (e *env) defaultRoutes(t *testing.T) {
	t.Helper()
	e.ns.MustIP(t, "route", "add", "default", "via", "198.18.0.2", "dev", "out0")
	e.ns.MustIP(t, "-6", "route", "add", "default", "via", "2001:db8::2", "dev", "out0")
}

// table returns the lines of "ip route show table" for both families (a
// table IPv6 never had a route or rule for does not exist, and has none).
func (e *env) table(t *testing.T) string {
	t.Helper()
	tbl := strconv.Itoa(table)
	out := e.ns.MustIP(t, "-4", "route", "show", "table", tbl)
	v6, err := e.ns.IP(t.Context(), "-6", "route", "show", "table", tbl)
	if err != nil && !strings.Contains(v6, "does not exist") {
		t.Fatalf("ip -6 route show table %s: %v\n%s", tbl, err, v6)
	}
	if err == nil {
		out += v6
	}
	return out
}

// ruleCount returns how many rules of the family look up the test table.
func (e *env) ruleCount(t *testing.T, fam string) int {
	t.Helper()
	return strings.Count(e.ns.MustIP(t, fam, "rule", "show"), "lookup "+strconv.Itoa(table))
}

// killTUN deletes tun0, as the kernel does when espd dies (its routes go
// with it), and makes a new tun0, as the next espd does.
func (e *env) killTUN(t *testing.T) {
	t.Helper()
	e.ns.MustIP(t, "link", "del", "tun0")
}

func (e *env) newTUN(t *testing.T) {
	t.Helper()
	e.ns.MustIP(t, "tuntap", "add", "mode", "tun", "name", "tun0")
	e.ns.MustIP(t, "link", "set", "tun0", "up")
	err := e.ns.Do(func() error {
		l, err := netlink.LinkByName("tun0")
		if err == nil {
			e.index = l.Attrs().Index
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// expect checks the device (or blackhole, unreachable) of each unmarked
// destination.
func (e *env) expect(t *testing.T, when string, want map[string]string) {
	t.Helper()
	for dst, w := range want {
		if got := e.dev(t, dst, 0); got != w {
			t.Errorf("%s: %s via %s, want %s", when, dst, got, w)
		}
	}
}

// hasLine reports whether out has a line containing every one of subs.
func hasLine(out string, subs ...string) bool {
	for line := range strings.SplitSeq(out, "\n") {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok && line != "" {
			return true
		}
	}
	return false
}

// TestHoldOutlivesTUN: a tunnel prefix has its TUN route (which lookups
// pick) and, in the same table, a blackhole at HoldMetric; when the TUN
// disappears, as it does when espd is killed, lookups hit the blackhole,
// not the main table's default route.
func TestHoldOutlivesTUN(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	r := e.router(t, routing.Config{})
	mustAdd(t, r, "198.18.60.0/24", routing.Tunnel)
	mustAdd(t, r, "2001:db8:60::/48", routing.Tunnel)
	out := e.table(t)
	metric := "metric " + strconv.Itoa(routing.HoldMetric)
	for _, want := range [][]string{
		{"198.18.60.0/24 dev tun0", "proto 229"},
		{"blackhole 198.18.60.0/24", "proto 229", metric},
		{"2001:db8:60::/48 dev tun0", "proto 229"},
		{"blackhole 2001:db8:60::/48", "proto 229", metric},
	} {
		if !hasLine(out, want...) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	e.expect(t, "with the TUN", map[string]string{
		"198.18.60.9": "tun0", "2001:db8:60::9": "tun0", "198.18.61.9": "out0", "2001:db8:61::9": "out0",
	})
	if rs := r.Routes(); len(rs) != 2 || !rs[0].Held || rs[0].Installed != routing.Tunnel {
		t.Errorf("Routes() = %+v", rs)
	}

	e.killTUN(t)
	e.expect(t, "TUN gone", map[string]string{
		"198.18.60.9": "blackhole", "2001:db8:60::9": "blackhole", "198.18.61.9": "out0", "2001:db8:61::9": "out0",
	})
	// The owner's removal opens the prefix again; the TUN route is gone
	// already, which is no error.
	mustRemove(t, r, "198.18.60.0/24", routing.Tunnel)
	mustRemove(t, r, "2001:db8:60::/48", routing.Tunnel)
	e.expect(t, "removed", map[string]string{"198.18.60.9": "out0", "2001:db8:60::9": "out0"})
	if out := e.table(t); strings.TrimSpace(out) != "" {
		t.Errorf("routes left after the last reference went:\n%s", out)
	}
}

// TestBypassUnderHoldSurvives: the management bypass under a default
// protect policy keeps working while the TUN is gone; everything else is
// held.
func TestBypassUnderHoldSurvives(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	r := e.router(t, routing.Config{})
	mustAdd(t, r, "0.0.0.0/0", routing.Tunnel)
	mustAdd(t, r, "::/0", routing.Tunnel)
	mustAdd(t, r, "198.18.0.0/24", routing.Throw)
	mustAdd(t, r, "2001:db8::/64", routing.Throw)
	e.expect(t, "with the TUN", map[string]string{
		"198.18.0.9": "out0", "2001:db8::9": "out0", "198.18.7.7": "tun0", "2001:db8:7::7": "tun0",
	})
	e.killTUN(t)
	e.expect(t, "TUN gone", map[string]string{
		"198.18.0.9": "out0", "2001:db8::9": "out0", "198.18.7.7": "blackhole", "2001:db8:7::7": "blackhole",
	})
}

// TestThrowToTunnelHeld: a prefix moving between a throw route and the TUN
// route is held across the swap.
func TestThrowToTunnelHeld(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	r := e.router(t, routing.Config{})
	const p = "198.18.44.0/24"
	mustAdd(t, r, p, routing.Throw)
	if out := e.table(t); strings.Contains(out, "blackhole") {
		t.Errorf("a bypass alone is held:\n%s", out)
	}
	mustAdd(t, r, p, routing.Tunnel)
	if out := e.table(t); !hasLine(out, "blackhole "+p) || !hasLine(out, p+" dev tun0") || strings.Contains(out, "throw") {
		t.Errorf("tunnel over a bypass:\n%s", out)
	}
	mustRemove(t, r, p, routing.Tunnel)
	if out := e.table(t); strings.Contains(out, "blackhole") || !hasLine(out, "throw "+p) {
		t.Errorf("after the tunnel reference went:\n%s", out)
	}
}

// TestCloseKeepsHolds: the orderly stop with policies installed removes
// the TUN routes but keeps the holds, the throw routes and the rules; the
// next New adopts them.
func TestCloseKeepsHolds(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	r := e.router(t, routing.Config{})
	mustAdd(t, r, "198.18.70.0/24", routing.Tunnel)
	mustAdd(t, r, "198.18.70.0/25", routing.Throw)
	mustAdd(t, r, "2001:db8:70::/48", routing.Tunnel)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	out := e.table(t)
	if strings.Contains(out, "dev tun0") {
		t.Errorf("TUN routes left after Close:\n%s", out)
	}
	for _, want := range []string{"blackhole 198.18.70.0/24", "throw 198.18.70.0/25", "blackhole 2001:db8:70::/48"} {
		if !hasLine(out, want) {
			t.Errorf("Close removed %q:\n%s", want, out)
		}
	}
	for _, fam := range []string{"-4", "-6"} {
		if n := e.ruleCount(t, fam); n != 1 {
			t.Errorf("%s: %d rules after Close, want 1", fam, n)
		}
	}
	e.expect(t, "stopped", map[string]string{"198.18.70.9": "out0", "198.18.70.200": "blackhole", "2001:db8:70::9": "blackhole"})
	r2 := e.router(t, routing.Config{})
	if n := r2.Adopted(); n != 3 {
		t.Errorf("Adopted() = %d after a Close with holds, want 3", n)
	}
}

// TestCloseWithoutHoldsRemovesEverything: with no tunnel reference left
// (bypasses only, or every policy removed) Close leaves nothing.
func TestCloseWithoutHoldsRemovesEverything(t *testing.T) {
	e := newEnv(t)
	r := e.router(t, routing.Config{})
	mustAdd(t, r, "198.18.70.0/24", routing.Tunnel)
	mustAdd(t, r, "198.18.70.0/25", routing.Throw)
	mustAdd(t, r, "0.0.0.0/0", routing.Throw)
	mustAdd(t, r, "2001:db8:70::/48", routing.Throw)
	mustRemove(t, r, "198.18.70.0/24", routing.Tunnel)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if out := e.ns.MustIP(t, "route", "show", "table", "all", "proto", "229"); strings.TrimSpace(out) != "" {
		t.Errorf("routes left:\n%s", out)
	}
	if out := e.ns.MustIP(t, "-6", "route", "show", "table", "all", "proto", "229"); strings.TrimSpace(out) != "" {
		t.Errorf("IPv6 routes left:\n%s", out)
	}
	for _, fam := range []string{"-4", "-6"} {
		if n := e.ruleCount(t, fam); n != 0 {
			t.Errorf("%s: %d rules left", fam, n)
		}
	}
}
