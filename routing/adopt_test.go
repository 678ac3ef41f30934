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

	"github.com/espd/espd/routing"
)

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
