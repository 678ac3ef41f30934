package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// espdTable is the routing table espd uses by default (routing.DefaultTable).
const espdTable = 0xe5d0

// espdPriority is the preference of espd's source rules by default
// (routing.DefaultPriority); its mark rules are one below and one above.
const espdPriority = 0xe5d

// kernelState lists what espd put into a gateway's kernel: its TUN, its
// policy-routing rules (those that look up its table and the mark rules
// around them) and the routes of its table.
func kernelState(t *testing.T, ctx context.Context, n *testbed.Node) (tun bool, rules, routes []string) {
	t.Helper()
	_, err := n.IP(ctx, "link", "show", "dev", tunName)
	tun = err == nil
	for _, fam := range []string{"-4", "-6"} {
		out, err := n.IP(ctx, fam, "rule", "show")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(out, "\n") {
			pref, _, _ := strings.Cut(line, ":")
			if strings.Contains(line, fmt.Sprint(espdTable)) || strings.Contains(line, fmt.Sprintf("%#x", espdTable)) ||
				pref == fmt.Sprint(espdPriority-1) || pref == fmt.Sprint(espdPriority+1) {
				rules = append(rules, fam+" "+strings.TrimSpace(line))
			}
		}
		out, _ = n.IP(ctx, fam, "route", "show", "table", fmt.Sprint(espdTable))
		for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
			if line != "" {
				routes = append(routes, fam+" "+line)
			}
		}
	}
	return tun, rules, routes
}

// lanARules reports whether rules are exactly those of policies from LAN
// A: per family the rule of its prefix and the two mark rules.
func lanARules(rules []string) bool {
	all := strings.Join(rules, "\n")
	return len(rules) == 6 && strings.Contains(all, "from "+testbed.LANAV4.String()+" lookup") &&
		strings.Contains(all, "from "+testbed.LANAV6.String()+" lookup")
}

// TestShutdown stops a keyed espd with SIGTERM: it must exit cleanly and
// take its TUN and the routes into it with it, but keep the rules and the
// blackhole routes that hold its policies' prefixes closed (fail closed,
// routing's package doc); a new espd in the same namespace then starts,
// adopts them and, keyed again, forwards.
func TestShutdown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tn := newTunnel(t, tunnelOpts{})
	ping(t, ctx, tn.top, testbed.IPv6, false)
	tun, rules, routes := kernelState(t, ctx, tn.top.GwA)
	if !tun || !lanARules(rules) || len(routes) < 2 {
		t.Fatalf("running espd: TUN %v, rules %q, routes %q; want the TUN, LAN A's rule and the mark rules per family and a route per LAN", tun, rules, routes)
	}
	t.Logf("running espd installed rules %q and routes %q", rules, routes)
	if err := tn.a.proc.Stop(10 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\nlog:\n%s", err, tail(tn.a.proc.Log(), 40))
	}
	if code, _ := tn.a.proc.ExitCode(); code != 0 {
		t.Errorf("espd exit status %d after SIGTERM", code)
	}
	tun, rules, routes = kernelState(t, ctx, tn.top.GwA)
	held := strings.Join(routes, "\n")
	if tun || !lanARules(rules) || strings.Contains(held, "dev "+tunName) ||
		!strings.Contains(held, "blackhole "+testbed.LANBV4.String()) || !strings.Contains(held, "blackhole "+testbed.LANBV6.String()) {
		t.Errorf("after SIGTERM: TUN %v, rules %q, routes %q; want no TUN, the rules and LAN B held by blackholes", tun, rules, routes)
	}

	// A fresh espd on gwA starts empty and, keyed again, restores the
	// tunnel. gwB's states are installed again too: its inbound state's
	// replay window has seen the sequence numbers gwA starts over with.
	a := startEspd(t, tn.top.GwA)
	if got := a.spis(t); len(got) != 0 {
		t.Errorf("a fresh espd has states %v", keys(got))
	}
	tn.keyA(t, a)
	tn.b.mustCtl(t, "sa", "flush")
	for _, s := range tn.bSAs {
		tn.b.addSA(t, s)
	}
	for _, f := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		ping(t, ctx, tn.top, f, false)
	}
	a.alive(t)
}
