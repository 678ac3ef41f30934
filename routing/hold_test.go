package routing_test

import (
	"bufio"
	"context"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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

// monitor records rule events in the namespace ("ip monitor rule").
type monitor struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	text strings.Builder
	seen chan string
	done chan struct{}
}

func (e *env) monitorRules(t *testing.T) *monitor {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	m := &monitor{cmd: exec.CommandContext(ctx, "ip", "-n", e.ns.Name, "monitor", "rule"), seen: make(chan string, 1024), done: make(chan struct{})}
	stdout, err := m.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); m.cmd.Wait() })
	go func() {
		defer close(m.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			m.mu.Lock()
			m.text.WriteString(sc.Text() + "\n")
			m.mu.Unlock()
			select {
			case m.seen <- sc.Text():
			default:
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	// The monitor listens once it reports a marker rule.
	m.mark(t, e, "198.18.99.1")
	return m
}

// mark adds and removes a marker rule and waits until the monitor has
// reported it: every event before it has been read.
func (m *monitor) mark(t *testing.T, e *env, from string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		e.ns.MustIP(t, "rule", "add", "pref", "100", "from", from, "lookup", "100")
		e.ns.MustIP(t, "rule", "del", "pref", "100", "from", from, "lookup", "100")
		for {
			select {
			case line := <-m.seen:
				if strings.Contains(line, from) {
					return
				}
				continue
			case <-tick.C:
			case <-deadline:
				t.Fatal("ip monitor rule reported nothing within 10 s")
			}
			break
		}
	}
}

func (m *monitor) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.text.String()
}

// TestNewAdoptsHolds: what a killed instance leaves (holds, throw routes,
// rules; its TUN routes went with its TUN) is taken over by the next New
// without ever removing a rule or a hold: the prefixes stay closed and the
// bypasses open throughout. A later AddRoute claims an adopted route and
// its RemoveRoute removes it.
func TestNewAdoptsHolds(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	var old *routing.Router
	err := e.ns.Do(func() (err error) {
		old, err = routing.New(routing.Config{LinkIndex: e.index, LinkName: "tun0", Table: table})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	mustAdd(t, old, "198.18.50.0/24", routing.Tunnel)
	mustAdd(t, old, "2001:db8:50::/48", routing.Tunnel)
	mustAdd(t, old, "198.18.51.0/24", routing.Tunnel)
	mustAdd(t, old, "198.18.52.0/24", routing.Throw)
	// Killed: its TUN goes, Close never runs (the handle is closed only
	// at the end of the test, when nothing depends on it any more).
	e.killTUN(t)
	held := map[string]string{
		"198.18.50.9": "blackhole", "2001:db8:50::9": "blackhole", "198.18.51.9": "blackhole",
		"198.18.52.9": "out0", "198.18.53.9": "out0",
	}
	e.expect(t, "killed", held)

	e.newTUN(t)
	m := e.monitorRules(t)
	r := e.router(t, routing.Config{})
	m.mark(t, e, "198.18.99.2")
	if ev := m.String(); hasLine(ev, "Deleted", "lookup "+strconv.Itoa(table)) {
		t.Errorf("New removed a rule of the table (a moment without it leaks):\n%s", ev)
	}
	for _, fam := range []string{"-4", "-6"} {
		if n := e.ruleCount(t, fam); n != 1 {
			t.Errorf("%s: %d rules after New, want 1", fam, n)
		}
	}
	if n := r.Adopted(); n != 4 {
		t.Errorf("Adopted() = %d, want 4 (three holds, one throw)", n)
	}
	e.expect(t, "restarted, no policies yet", held)

	// The owner installs its policies again: the TUN route wins over the
	// hold it claims.
	mustAdd(t, r, "198.18.50.0/24", routing.Tunnel)
	mustAdd(t, r, "2001:db8:50::/48", routing.Tunnel)
	mustAdd(t, r, "198.18.52.0/24", routing.Throw)
	e.expect(t, "policies back", map[string]string{
		"198.18.50.9": "tun0", "2001:db8:50::9": "tun0", "198.18.51.9": "blackhole", "198.18.52.9": "out0",
	})
	rs := r.Routes()
	for _, rt := range rs {
		switch rt.Prefix.String() {
		case "198.18.50.0/24":
			if rt.AdoptedHold || !rt.Held || rt.Tunnel != 1 {
				t.Errorf("claimed hold: %+v", rt)
			}
		case "198.18.51.0/24":
			if !rt.AdoptedHold || !rt.Held || rt.Tunnel != 0 {
				t.Errorf("unclaimed hold: %+v", rt)
			}
		case "198.18.52.0/24":
			if rt.AdoptedThrow || rt.Throws != 1 || rt.Installed != routing.Throw {
				t.Errorf("claimed throw: %+v", rt)
			}
		}
	}
	// The owner removes them: claimed holds go, the unclaimed one stays.
	mustRemove(t, r, "198.18.50.0/24", routing.Tunnel)
	mustRemove(t, r, "2001:db8:50::/48", routing.Tunnel)
	mustRemove(t, r, "198.18.52.0/24", routing.Throw)
	e.expect(t, "policies removed", map[string]string{
		"198.18.50.9": "out0", "2001:db8:50::9": "out0", "198.18.51.9": "blackhole", "198.18.52.9": "out0",
	})
	out := e.table(t)
	if strings.Contains(out, "198.18.50.0/24") || strings.Contains(out, "2001:db8:50::") || strings.Contains(out, "198.18.52.0/24") {
		t.Errorf("removed routes left:\n%s", out)
	}
	t.Cleanup(func() { old.Close() })
}

// TestAdoptedHoldNotOpenedByBypass: a bypass for a prefix whose adopted
// hold no tunnel reference has claimed leaves it closed (as a protect and
// a bypass sharing a prefix route into the TUN); once a tunnel reference
// claims the hold and goes, the bypass applies. The hold was left without
// a rule: New gives it the /0 source's.
func TestAdoptedHoldNotOpenedByBypass(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	tbl := strconv.Itoa(table)
	e.ns.MustIP(t, "route", "add", "blackhole", "198.18.45.0/24", "table", tbl, "proto", "229", "metric", strconv.Itoa(routing.HoldMetric))
	r := e.router(t, routing.Config{})
	const p = "198.18.45.0/24"
	mustAdd(t, r, p, routing.Throw)
	e.expect(t, "bypass over an adopted hold", map[string]string{"198.18.45.9": "blackhole"})
	mustAdd(t, r, p, routing.Tunnel)
	e.expect(t, "tunnel claims it", map[string]string{"198.18.45.9": "tun0"})
	mustRemove(t, r, p, routing.Tunnel)
	e.expect(t, "tunnel removed", map[string]string{"198.18.45.9": "out0"})
	if out := e.table(t); strings.Contains(out, "blackhole") || !hasLine(out, "throw "+p) {
		t.Errorf("table:\n%s", out)
	}
}

// TestNewTidiesLeftovers: a route into a TUN that survived becomes a hold
// (the blackhole goes in before the route comes out), a blackhole at
// another metric is moved to HoldMetric, routes of other types are
// removed, routes not tagged 229 are left alone, and the rule a previous
// instance left is kept, not added twice.
func TestNewTidiesLeftovers(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	tbl := strconv.Itoa(table)
	pref := strconv.Itoa(routing.DefaultPriority)
	e.ns.MustIP(t, "rule", "add", "pref", pref, "not", "fwmark", "0xe5d0/0xffffffff", "lookup", tbl)
	e.ns.MustIP(t, "-6", "rule", "add", "pref", pref, "not", "fwmark", "0xe5d0/0xffffffff", "lookup", tbl)
	e.ns.MustIP(t, "route", "add", "198.18.80.0/24", "dev", "out0", "table", tbl, "proto", "229")
	e.ns.MustIP(t, "-6", "route", "add", "2001:db8:80::/48", "dev", "out0", "table", tbl, "proto", "229")
	e.ns.MustIP(t, "route", "add", "blackhole", "198.18.82.0/24", "table", tbl, "proto", "229", "metric", "7")
	e.ns.MustIP(t, "route", "add", "unreachable", "198.18.83.0/24", "table", tbl, "proto", "229")
	e.ns.MustIP(t, "route", "add", "throw", "198.18.81.0/24", "table", tbl, "proto", "static") // not ours
	r := e.router(t, routing.Config{})
	for _, fam := range []string{"-4", "-6"} {
		if n := e.ruleCount(t, fam); n != 1 {
			t.Errorf("%s: %d rules for the table after New, want 1", fam, n)
		}
	}
	out := e.table(t)
	metric := "metric " + strconv.Itoa(routing.HoldMetric)
	for _, want := range [][]string{
		{"blackhole 198.18.80.0/24", metric}, {"blackhole 2001:db8:80::/48", metric},
		{"blackhole 198.18.82.0/24", metric}, {"throw 198.18.81.0/24", "proto static"},
	} {
		if !hasLine(out, want...) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	for _, gone := range []string{"198.18.80.0/24 dev", "2001:db8:80::/48 dev out0", "metric 7", "198.18.83.0/24"} {
		if strings.Contains(out, gone) {
			t.Errorf("table still has %q:\n%s", gone, out)
		}
	}
	if n := r.Adopted(); n != 3 {
		t.Errorf("Adopted() = %d, want 3", n)
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

// TestCleanup removes the rules and every route tagged 229 in the table,
// says what it removed, and leaves the rest alone; LiveRoutes sees a
// running instance's TUN routes.
func TestCleanup(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	tbl := strconv.Itoa(table)
	e.ns.MustIP(t, "route", "add", "throw", "198.18.81.0/24", "table", tbl, "proto", "static") // not ours
	r := e.router(t, routing.Config{})
	mustAdd(t, r, "0.0.0.0/0", routing.Tunnel)
	mustAdd(t, r, "::/0", routing.Tunnel)
	mustAdd(t, r, "198.18.0.0/24", routing.Throw)
	cfg := routing.Config{Table: table}
	var live []string
	err := e.ns.Do(func() (err error) {
		live, err = routing.LiveRoutes(cfg)
		return err
	})
	if err != nil || len(live) != 2 {
		t.Errorf("LiveRoutes with a running router = %q, %v; want the two TUN routes", live, err)
	}
	e.killTUN(t)
	err = e.ns.Do(func() (err error) {
		live, err = routing.LiveRoutes(cfg)
		return err
	})
	if err != nil || len(live) != 0 {
		t.Errorf("LiveRoutes with the TUN gone = %q, %v; want none", live, err)
	}
	var removed []string
	err = e.ns.Do(func() (err error) {
		removed, err = routing.Cleanup(cfg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(removed, "\n")
	for _, want := range []string{"rule inet pref", "rule inet6 pref", "blackhole 0.0.0.0/0", "blackhole ::/0", "throw 198.18.0.0/24"} {
		if !strings.Contains(got, want) {
			t.Errorf("Cleanup did not report %q:\n%s", want, got)
		}
	}
	if len(removed) != 5 {
		t.Errorf("Cleanup removed %d things, want 5:\n%s", len(removed), got)
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
	if out := e.table(t); !strings.Contains(out, "198.18.81.0/24") {
		t.Errorf("Cleanup removed a route not tagged 229:\n%s", out)
	}
	e.expect(t, "cleaned up", map[string]string{"198.18.7.7": "out0", "2001:db8:7::7": "out0"})
	err = e.ns.Do(func() (err error) {
		removed, err = routing.Cleanup(cfg)
		return err
	})
	if err != nil || len(removed) != 0 {
		t.Errorf("second Cleanup = %q, %v; want nothing", removed, err)
	}
}
