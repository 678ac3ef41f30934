package routing_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/espd/espd/routing"
)

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

var protoRE = regexp.MustCompile(` proto \S+`)

// rules returns the lines of "ip rule show" of the family at espd's three
// preferences (the mark rules and the source rules), without their
// protocol.
func (e *env) rules(t *testing.T, fam string) []string {
	t.Helper()
	var out []string
	for line := range strings.SplitSeq(e.ns.MustIP(t, fam, "rule", "show"), "\n") {
		for _, pref := range []int{routing.DefaultPriority - 1, routing.DefaultPriority, routing.DefaultPriority + 1} {
			if strings.HasPrefix(line, strconv.Itoa(pref)+":") {
				out = append(out, protoRE.ReplaceAllString(strings.Join(strings.Fields(line), " "), ""))
			}
		}
	}
	return out
}

// wantRules checks the family's rules at espd's preferences: exactly
// sources' rules, and the mark rules when one of them is narrower than /0.
func (e *env) wantRules(t *testing.T, when, fam string, sources ...string) {
	t.Helper()
	pref := routing.DefaultPriority
	lookup := " lookup " + strconv.Itoa(table)
	var want []string
	narrow := false
	for _, s := range sources {
		if strings.HasSuffix(s, "/0") {
			want = append(want, strconv.Itoa(pref)+": not from all fwmark 0xe5d0"+lookup)
		} else {
			want = append(want, strconv.Itoa(pref)+": from "+s+lookup)
			narrow = true
		}
	}
	if narrow {
		want = append(want, strconv.Itoa(pref-1)+": from all fwmark 0xe5d0 goto "+strconv.Itoa(pref+1),
			strconv.Itoa(pref+1)+": from all nop")
	}
	got := e.rules(t, fam)
	missing := false
	for _, w := range want {
		missing = missing || !containsLine(got, w)
	}
	if missing || len(got) != len(want) {
		t.Errorf("%s: %s rules\n%s\nwant\n%s", when, fam, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func containsLine(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}

// expectFrom checks the device of packets from src to dst ("src>dst"),
// arriving on lan0, unmarked.
func (e *env) expectFrom(t *testing.T, when string, want map[string]string) {
	t.Helper()
	for k, w := range want {
		src, dst, _ := strings.Cut(k, ">")
		if got := e.devFrom(t, dst, src, 0); got != w {
			t.Errorf("%s: from %s to %s via %s, want %s", when, src, dst, got, w)
		}
	}
}

// TestSourceRule is issue 26: a full tunnel for a LAN (from 198.18.1.0/24
// to 0.0.0.0/0) takes the LAN's packets into the TUN and nothing else:
// not packets from elsewhere (management access, what is decrypted and
// forwarded to the LAN), not the gateway's own, not espd's marked ones
// even from the LAN's addresses; bypass-lan's pass policy (LAN to LAN, a
// throw route) keeps the LAN's packets to the LAN out.
func TestSourceRule(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	e.lan(t)
	r := e.router(t, routing.Config{})
	const lan, lan6 = "198.18.1.0/24", "2001:db8:1::/64"
	mustAddFrom(t, r, lan, "0.0.0.0/0", routing.Tunnel)
	mustAddFrom(t, r, lan6, "::/0", routing.Tunnel)
	mustAddFrom(t, r, lan, lan, routing.Throw)
	mustAddFrom(t, r, lan6, lan6, routing.Throw)
	e.wantRules(t, "full tunnel", "-4", lan)
	e.wantRules(t, "full tunnel", "-6", lan6)
	e.expectFrom(t, "full tunnel", map[string]string{
		"198.18.1.9>198.19.7.7":        "tun0",
		"198.18.1.9>198.18.0.2":        "tun0", // the peer's network too
		"2001:db8:1::9>2001:db8:7::7":  "tun0",
		"198.18.1.9>198.18.1.7":        "lan0", // bypass-lan
		"2001:db8:1::9>2001:db8:1::7":  "lan0",
		"198.18.0.9>198.19.7.7":        "out0", // another source
		"198.19.7.7>198.18.1.7":        "lan0", // decrypted, to the LAN
		"2001:db8:7::7>2001:db8:1::7":  "lan0",
		"2001:db8::9>2001:db8:7::7":    "out0",
		"2001:db8:7::7>2001:db8:0::99": "out0",
	})
	// The gateway's own traffic: unbound, and from its outer address.
	e.expect(t, "own traffic", map[string]string{"198.19.7.7": "out0", "2001:db8:7::7": "out0"})
	for _, c := range []struct{ dst, src string }{{"198.19.7.7", "198.18.0.1"}, {"2001:db8:7::7", "2001:db8::1"}} {
		if got := e.routeGet(t, c.dst, 0, "from", c.src); got != "out0" {
			t.Errorf("from the gateway's %s to %s via %s, want out0", c.src, c.dst, got)
		}
	}
	// espd's own packets, marked, skip the table even from the LAN's
	// addresses (a host-to-host tunnel's source is the outer address).
	for _, c := range []struct{ dst, src string }{{"198.19.7.7", "198.18.1.9"}, {"2001:db8:7::7", "2001:db8:1::9"}} {
		if got := e.devFrom(t, c.dst, c.src, routing.DefaultMark); got != "out0" {
			t.Errorf("marked from %s to %s via %s, want out0", c.src, c.dst, got)
		}
	}

	// A second policy of the source shares its rule.
	mustAddFrom(t, r, lan, "198.19.0.0/16", routing.Tunnel)
	e.wantRules(t, "two policies of one source", "-4", lan)
	if ss := r.Sources(); len(ss) != 2 || ss[0].Prefix.String() != lan || ss[0].Refs != 2 || !ss[0].Installed {
		t.Errorf("Sources() = %+v", ss)
	}
	mustRemoveFrom(t, r, lan, "0.0.0.0/0", routing.Tunnel)
	e.wantRules(t, "one policy left", "-4", lan)
	e.expectFrom(t, "one policy left", map[string]string{"198.18.1.9>198.19.7.7": "tun0", "198.18.1.9>198.20.7.7": "out0"})
	if err := r.RemoveRoute(mustPrefix("198.18.2.0/24"), mustPrefix("198.19.0.0/16"), routing.Tunnel); err == nil {
		t.Error("removing a reference of another source succeeded")
	}
	mustRemoveFrom(t, r, lan, "198.19.0.0/16", routing.Tunnel)
	e.wantRules(t, "last policy removed", "-4")
	e.wantRules(t, "IPv6 policy left", "-6", lan6)
	mustRemoveFrom(t, r, lan6, "::/0", routing.Tunnel)
	e.wantRules(t, "all removed", "-6")
	// The throws take no rule; they stay until their own removal.
	mustRemoveFrom(t, r, lan, lan, routing.Throw)
	mustRemoveFrom(t, r, lan6, lan6, routing.Throw)
	if out := e.table(t); strings.TrimSpace(out) != "" {
		t.Errorf("table after everything was removed:\n%s", out)
	}
	if ss := r.Sources(); len(ss) != 0 {
		t.Errorf("Sources() = %+v after everything was removed", ss)
	}
}

// TestSourcesAndAnySource: the /0 source's rule is the one espd always
// had, and it lives beside narrower sources' rules; sources of different
// families must not mix.
func TestSourcesAndAnySource(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	e.lan(t)
	r := e.router(t, routing.Config{})
	mustAddFrom(t, r, "0.0.0.0/0", "198.19.9.0/24", routing.Tunnel)
	e.wantRules(t, "/0 source", "-4", "0.0.0.0/0")
	mustAddFrom(t, r, "198.18.1.0/24", "198.19.0.0/16", routing.Tunnel)
	e.wantRules(t, "/0 and a narrower source", "-4", "0.0.0.0/0", "198.18.1.0/24")
	e.expectFrom(t, "both", map[string]string{"198.18.0.9>198.19.9.9": "tun0", "198.18.1.9>198.19.7.7": "tun0"})
	mustRemoveFrom(t, r, "198.18.1.0/24", "198.19.0.0/16", routing.Tunnel)
	e.wantRules(t, "/0 source left", "-4", "0.0.0.0/0")
	if err := r.AddRoute(mustPrefix("2001:db8:1::/64"), mustPrefix("198.19.0.0/16"), routing.Tunnel); err == nil {
		t.Error("a reference with an IPv6 source and an IPv4 destination succeeded")
	}
	e.wantRules(t, "refused reference", "-6")
}

// TestCloseKeepsSourceRules: an orderly stop with a narrow source's policy
// keeps its rule and the mark rules with the hold; the LAN's packets are
// dropped, everyone else's are routed as ever.
func TestCloseKeepsSourceRules(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	e.lan(t)
	r := e.router(t, routing.Config{})
	mustAddFrom(t, r, "198.18.1.0/24", "0.0.0.0/0", routing.Tunnel)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	e.wantRules(t, "after Close", "-4", "198.18.1.0/24")
	e.expectFrom(t, "stopped", map[string]string{"198.18.1.9>198.19.7.7": "blackhole", "198.18.0.9>198.19.7.7": "out0"})
	if got := e.devFrom(t, "198.19.7.7", "198.18.1.9", routing.DefaultMark); got != "out0" {
		t.Errorf("marked from the LAN via %s after Close, want out0", got)
	}
}

// TestNewAdoptsSourceRules: New adds no rule of its own, keeps a previous
// instance's rules while a hold it adopted is unclaimed (never removing
// one meanwhile), and removes them once every adopted hold is claimed and
// no reference claims their source; a reference of the same source claims
// the rule.
func TestNewAdoptsSourceRules(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	e.lan(t)
	old := e.router(t, routing.Config{})
	mustAddFrom(t, old, "198.18.1.0/24", "198.19.1.0/24", routing.Tunnel)
	mustAddFrom(t, old, "198.18.1.0/24", "198.19.2.0/24", routing.Tunnel)
	mustAddFrom(t, old, "198.18.3.0/24", "198.19.3.0/24", routing.Tunnel)
	e.killTUN(t)
	if err := old.Close(); err != nil { // the handle; holds and rules stay
		t.Fatal(err)
	}
	// A duplicate, as a crash between two instances' adds could leave.
	e.ns.MustIP(t, "rule", "add", "pref", strconv.Itoa(routing.DefaultPriority), "from", "198.18.3.0/24", "lookup", strconv.Itoa(table))
	e.newTUN(t)
	m := e.monitorRules(t)
	r := e.router(t, routing.Config{})
	m.mark(t, e, "198.18.99.2")
	if ev := m.String(); hasLine(ev, "Deleted", "198.18.1.0/24") || hasLine(ev, "Deleted", "goto") {
		t.Errorf("New removed a rule an unclaimed hold needs:\n%s", ev)
	}
	e.wantRules(t, "adopted", "-4", "198.18.1.0/24", "198.18.3.0/24")
	if ss := r.Sources(); len(ss) != 2 || !ss[0].Adopted || !ss[1].Adopted {
		t.Errorf("Sources() = %+v, want two adopted", ss)
	}
	e.expectFrom(t, "adopted", map[string]string{
		"198.18.1.9>198.19.1.9": "blackhole", "198.18.3.9>198.19.3.9": "blackhole", "198.18.0.9>198.19.1.9": "out0",
	})

	// The same source claims its rule; 198.18.3.0/24's stays while the
	// holds it may serve are unclaimed.
	mustAddFrom(t, r, "198.18.1.0/24", "198.19.1.0/24", routing.Tunnel)
	mustAddFrom(t, r, "198.18.1.0/24", "198.19.2.0/24", routing.Tunnel)
	e.wantRules(t, "two holds claimed", "-4", "198.18.1.0/24", "198.18.3.0/24")
	// The last hold is claimed by another source: the adopted rules no
	// reference claims go.
	mustAddFrom(t, r, "198.18.4.0/24", "198.19.3.0/24", routing.Tunnel)
	e.wantRules(t, "every hold claimed", "-4", "198.18.1.0/24", "198.18.4.0/24")
	e.expectFrom(t, "every hold claimed", map[string]string{
		"198.18.1.9>198.19.1.9": "tun0", "198.18.3.9>198.19.3.9": "out0", "198.18.4.9>198.19.3.9": "tun0",
	})
	mustRemoveFrom(t, r, "198.18.1.0/24", "198.19.1.0/24", routing.Tunnel)
	mustRemoveFrom(t, r, "198.18.1.0/24", "198.19.2.0/24", routing.Tunnel)
	e.wantRules(t, "claimed source removed", "-4", "198.18.4.0/24")
}

// TestNewDropsRulesWithoutHolds: rules a previous instance left with
// nothing held (killed before any policy, or an older espd's rule per
// family) are removed by New: they would send packets to an empty table
// for nothing.
func TestNewDropsRulesWithoutHolds(t *testing.T) {
	e := newEnv(t)
	tbl, pref := strconv.Itoa(table), strconv.Itoa(routing.DefaultPriority)
	for _, fam := range []string{"-4", "-6"} {
		e.ns.MustIP(t, fam, "rule", "add", "pref", pref, "not", "fwmark", "0xe5d0/0xffffffff", "lookup", tbl)
	}
	e.ns.MustIP(t, "rule", "add", "pref", pref, "from", "198.18.1.0/24", "lookup", tbl)
	r := e.router(t, routing.Config{})
	for _, fam := range []string{"-4", "-6"} {
		e.wantRules(t, "New with nothing held", fam)
	}
	if ss := r.Sources(); len(ss) != 0 {
		t.Errorf("Sources() = %+v", ss)
	}
}

// TestHoldFileSources: the hold file records the sources with the
// prefixes; after a reboot RestoreHolds puts back exactly those rules (and
// the mark rules a narrow source needs), and New adopts them.
func TestHoldFileSources(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	e.lan(t)
	path := filepath.Join(t.TempDir(), "holds")
	cfg := routing.Config{HoldFile: path}
	r := e.router(t, cfg)
	mustAddFrom(t, r, "198.18.1.0/24", "0.0.0.0/0", routing.Tunnel)
	mustAddFrom(t, r, "2001:db8:1::/64", "2001:db8:7::/48", routing.Tunnel)
	mustAddFrom(t, r, "198.18.1.0/24", "198.18.1.0/24", routing.Throw)
	waitHoldFile(t, path, "from 198.18.1.0/24", "from 2001:db8:1::/64", "0.0.0.0/0", "2001:db8:7::/48")
	r.Close()
	e.reboot(t)
	e.wantRules(t, "rebooted", "-4")
	var done []string
	err := e.ns.Do(func() (err error) {
		done, err = routing.RestoreHolds(routing.Config{Table: table, HoldFile: path})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 8 { // two holds, two source rules, four mark rules
		t.Errorf("RestoreHolds did %q, want two routes and six rules", done)
	}
	e.wantRules(t, "restored", "-4", "198.18.1.0/24")
	e.wantRules(t, "restored", "-6", "2001:db8:1::/64")
	e.expectFrom(t, "restored", map[string]string{
		"198.18.1.9>198.19.7.7": "blackhole", "198.18.0.9>198.19.7.7": "out0",
		"2001:db8:1::9>2001:db8:7::7": "blackhole", "2001:db8::9>2001:db8:7::7": "out0",
	})
	// Again: nothing more to add.
	err = e.ns.Do(func() (err error) {
		done, err = routing.RestoreHolds(routing.Config{Table: table, HoldFile: path})
		return err
	})
	if err != nil || len(done) != 2 { // RouteReplace of the two holds
		t.Errorf("second RestoreHolds did %q, %v", done, err)
	}
	e.wantRules(t, "restored twice", "-4", "198.18.1.0/24")

	r2 := e.router(t, cfg)
	if ss := r2.Sources(); len(ss) != 2 || !ss[0].Adopted || !ss[0].Installed {
		t.Errorf("Sources() = %+v after New", ss)
	}
	mustAddFrom(t, r2, "198.18.1.0/24", "0.0.0.0/0", routing.Tunnel)
	mustAddFrom(t, r2, "2001:db8:1::/64", "2001:db8:7::/48", routing.Tunnel)
	mustRemoveFrom(t, r2, "198.18.1.0/24", "0.0.0.0/0", routing.Tunnel)
	mustRemoveFrom(t, r2, "2001:db8:1::/64", "2001:db8:7::/48", routing.Tunnel)
	waitHoldFile(t, path)
	e.wantRules(t, "all removed", "-4")
	e.wantRules(t, "all removed", "-6")
}

// TestRestoreHoldsFormat1: a hold file an older espd wrote is restored
// with the rule per family of its prefixes it had.
func TestRestoreHoldsFormat1(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "holds")
	if err := os.WriteFile(path, []byte("espd holds 1\n198.18.70.0/24\nend 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var done []string
	err := e.ns.Do(func() (err error) {
		done, err = routing.RestoreHolds(routing.Config{Table: table, HoldFile: path})
		return err
	})
	if err != nil || len(done) != 2 {
		t.Errorf("RestoreHolds = %q, %v; want a route and a rule", done, err)
	}
	e.wantRules(t, "format 1", "-4", "0.0.0.0/0")
	e.wantRules(t, "format 1", "-6")
}

// TestSourceWithHostAddress: a source that holds one of the host's own
// addresses on an interface reaching beyond it takes the /0 rule, since
// the host's own packets from unbound, unconnected sockets are routed
// before they have a source and would leave from that address in clear;
// a LAN source whose interface only reaches the LAN keeps its narrow
// rule. The rule chosen at the first reference is the one removed.
func TestSourceWithHostAddress(t *testing.T) {
	e := newEnv(t)
	e.lan(t)
	e.defaultRoutes(t)
	r := e.router(t, routing.Config{})
	// The full tunnel of the LAN: lan0 (198.18.1.1/24) reaches only it.
	mustAddFrom(t, r, "198.18.1.0/24", "0.0.0.0/0", routing.Tunnel)
	e.wantRules(t, "full tunnel of the LAN", "-4", "198.18.1.0/24")
	// Host to host from out0's address: out0 (198.18.0.1/16) reaches
	// beyond 198.18.0.1/32.
	mustAddFrom(t, r, "198.18.0.1/32", "198.19.5.0/24", routing.Tunnel)
	e.wantRules(t, "host-to-host policy", "-4", "198.18.1.0/24", "0.0.0.0/0")
	// A packet with no source yet (an unconnected UDP socket's) to the
	// policy's destination goes to the TUN, not out0 in clear.
	if got := e.routeGet(t, "198.19.5.1", 0); got != "tun0" {
		t.Errorf("host's own packet without a source to the host-to-host destination: dev %s, want tun0", got)
	}
	mustRemoveFrom(t, r, "198.18.0.1/32", "198.19.5.0/24", routing.Tunnel)
	e.wantRules(t, "host-to-host policy removed", "-4", "198.18.1.0/24")
	// The LAN reaches beyond itself through a router on it: a new
	// reference from it takes the /0 rule; the full tunnel's keeps the
	// narrow one it took.
	e.ns.MustIP(t, "route", "add", "198.19.50.0/24", "via", "198.18.1.254", "dev", "lan0")
	mustAddFrom(t, r, "198.18.1.0/24", "198.19.6.0/24", routing.Tunnel)
	e.wantRules(t, "a LAN with a router to elsewhere", "-4", "198.18.1.0/24", "0.0.0.0/0")
	mustRemoveFrom(t, r, "198.18.1.0/24", "198.19.6.0/24", routing.Tunnel)
	mustRemoveFrom(t, r, "198.18.1.0/24", "0.0.0.0/0", routing.Tunnel)
	e.wantRules(t, "all removed", "-4")
}
