package strongswantest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/testbed"
)

// TestPluginReconnectsAfterIdle: espd closes a control connection that
// stays silent for its idle timeout (control.DefaultIdleTimeout; espd has
// no flag to shorten it, so the test waits it out), and charon's plugin
// keeps one for its requests. After espd closed it, logging why, a rekey
// still installs its new SAs on both gateways: the plugin reconnects.
func TestPluginReconnectsAfterIdle(t *testing.T) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{})
	p.load(v4("aes128gcm16"))
	p.initiate()
	first, _ := p.a.installedChild("net")

	// Nothing asks charon for the SAs' counters from now on (swanctl
	// --list-sas would make the plugin query espd): its request
	// connections go quiet until espd closes them.
	closed := func(g *gateway) string {
		return fmt.Sprintf("closing the connection of pid %d (uid 0): idle for %v", g.charon.Pid(), control.DefaultIdleTimeout)
	}
	for _, g := range []*gateway{p.a, p.b} {
		if !waitFor(control.DefaultIdleTimeout+time.Minute, func() bool { return strings.Contains(g.espd.Log(), closed(g)) }) {
			t.Fatalf("%s: espd did not log the idle close of charon's connection (%q):\n%s", g.name, closed(g), tail(g.espd.Log(), 30))
		}
	}
	established := p.a.charonLogCount("CHILD_SA net{", "established")

	p.a.mustSwanctl("--rekey", "--child", "net")
	if !waitFor(30*time.Second, func() bool { return p.a.charonLogCount("CHILD_SA net{", "established") > established }) {
		t.Fatalf("A: the rekey did not complete:\n%s", tail(p.a.charon.Log(), 40))
	}
	next := p.a.waitChild("net", 10*time.Second)
	if next.SPIOut == first.SPIOut || next.SPIIn == first.SPIIn {
		t.Fatalf("A: CHILD_SA not rekeyed: SPIs %s/%s before, %s/%s after", first.SPIIn, first.SPIOut, next.SPIIn, next.SPIOut)
	}
	// Both espds hold the new SAs, marked negotiated.
	for _, g := range []*gateway{p.a, p.b} {
		want := next.SPIOut
		if g == p.b {
			want = next.SPIIn
		}
		if !waitFor(10*time.Second, func() bool { return strings.Contains(strings.Join(g.espdSPIs()["out"], " "), want) }) {
			t.Errorf("%s: espd lacks the rekeyed outbound SA %s: %v", g.name, want, g.espdSPIs())
		}
		if n := testbed.CountLines(g.charon.Log(), "espd:", "failed"); n != 0 {
			t.Errorf("%s: charon logged %d failed espd requests:\n%s", g.name, n, tail(g.charon.Log(), 40))
		}
	}
	transfer(t, p.topo.Client, p.topo.Server, testbed.IPv4, 1<<20, 0)
}
