package strongswantest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// stopCaptureNoLeaks stops a capture of the transit link and fails the
// test for each cleartext frame of the LANs' hosts in it; it returns the
// capture's result.
func stopCaptureNoLeaks(t *testing.T, c *testbed.Capture, what string) *testbed.CaptureResult {
	t.Helper()
	res, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s", what, res.Summary())
	if !res.Complete() {
		t.Errorf("capture incomplete: %d dropped, %d over the limit", res.Drops, res.Overflow)
	}
	leaks := res.Leaks(testbed.ClientV4.Addr(), testbed.ServerV4.Addr())
	for i, f := range leaks {
		if i == 10 {
			break
		}
		t.Errorf("cleartext on the transit link at %s: %s", f.Time.Format("15:04:05.000"), f.String())
	}
	if len(leaks) > 0 {
		t.Errorf("%s: %d cleartext frames of the LANs crossed the transit link", what, len(leaks))
	}
	return res
}

// restartCharon stops the gateway's charon (SIGTERM, or SIGKILL when kill)
// and starts it again with its connection, as systemd does.
func (g *gateway) restartCharon(o charonOptions, conn connection, kill bool) {
	g.t.Helper()
	if kill {
		if err := g.charon.Signal(syscall.SIGKILL); err != nil {
			g.t.Fatal(err)
		}
	}
	g.charon.Stop(20 * time.Second)
	g.startCharon(o)
	g.load(conn.String())
}

// pinger pings dst from n in the background, 20 a second, until the test
// ends (at most 10 minutes): traffic both ways through the tunnel for the
// whole of a test, so that any moment without protection shows on the
// transit link.
func pinger(t *testing.T, n *testbed.Node, dir string, dst string) *testbed.Process {
	t.Helper()
	p, err := n.Start(filepath.Join(dir, fmt.Sprintf("ping-%s-%d.log", n.Role, time.Now().UnixNano())), "ping", "-n", "-q", "-i", "0.05", "-c", "12000", dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(5 * time.Second) })
	return p
}

// restartEspd starts espd again after a kill, as systemd does
// (Restart=on-failure, RestartSec=1).
func (g *gateway) restartEspd() {
	g.t.Helper()
	time.Sleep(time.Second)
	g.runEspd()
}

// upgrade restarts espd and charon together, as an upgrade of both
// packages does: espd stops first, charon stops while espd is away (its
// IKE deletes cannot leave yet) and espd comes back while it stops.
func (g *gateway) upgrade(o charonOptions, conn connection) {
	g.t.Helper()
	g.termEspd()
	stopped := make(chan struct{})
	go func() {
		g.charon.Stop(20 * time.Second)
		close(stopped)
	}()
	g.runEspd()
	<-stopped
	g.startCharon(o)
	g.load(conn.String())
}

// oneWay reports whether a ping from the client crosses the tunnel.
func oneWay(p *pair) bool {
	r, err := p.topo.Client.Ping(context.Background(), testbed.ServerV4.Addr(), testbed.PingOptions{Count: 1, Wait: 500 * time.Millisecond})
	return err == nil && r.OK()
}

// bothWays reports whether a ping crosses the tunnel in each direction.
func bothWays(p *pair) bool {
	ctx := context.Background()
	o := testbed.PingOptions{Count: 1, Wait: 500 * time.Millisecond}
	r1, err1 := p.topo.Client.Ping(ctx, testbed.ServerV4.Addr(), o)
	r2, err2 := p.topo.Server.Ping(ctx, testbed.ClientV4.Addr(), o)
	return err1 == nil && r1.OK() && err2 == nil && r2.OK()
}

// TestCharonLifecycle runs a charon-keyed gateway's life on both gateways
// under traffic in both directions, with default routes that would carry
// any cleartext across the transit link: espd killed (systemd restarts
// it), charon restarted (SIGTERM: it deletes its CHILD_SAs and policies
// on the way out) and killed (SIGKILL), and both restarted together as an
// upgrade does, on the initiator A and on the responder B, with Debian's
// retransmit timers.
// Not one cleartext frame of the LANs crosses the transit link (the
// plugin keeps an outbound policy whose CHILD_SA went as a drop policy
// while its connection is loaded), and traffic passes both ways again
// within 5 s of the event's commands (systemctl, apt-get) returning.
// After a kill the new charon initiates to the peers the old one had SAs
// with; in an upgrade charon's deletes, sent while espd restarted, reach
// the peer when espd is back, and the peer negotiates again at its next
// IKE retransmit (4 s with Debian's timers: the new charon had not loaded
// its connection when the first try came).
func TestCharonLifecycle(t *testing.T) {
	requireStrongSwan(t)
	opts := charonOptions{DebianTimers: true}
	p := newPair(t, pairOptions{A: opts, B: opts})
	ctx := context.Background()
	for _, r := range []struct {
		n   *testbed.Node
		via string
	}{{p.topo.GwA, testbed.GwBTransitV4.Addr().String()}, {p.topo.GwB, testbed.GwATransitV4.Addr().String()}} {
		if _, err := r.n.IP(ctx, "-4", "route", "add", "default", "via", r.via); err != nil {
			t.Fatal(err)
		}
	}
	ca, cb := v4("aes128gcm16")
	ca.StartAction, ca.Child = "start", "        close_action = start"
	cb.StartAction = "trap"
	p.b.load(cb.String())
	p.a.load(ca.String())
	p.a.waitChild("net", 20*testSecond)
	p.b.waitChild("net", 20*testSecond)

	capture, err := p.topo.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if capture != nil {
			capture.Stop()
		}
	}()
	pinger(t, p.topo.Client, p.a.dir, testbed.ServerV4.Addr().String())
	fromServer := pinger(t, p.topo.Server, p.b.dir, testbed.ClientV4.Addr().String())
	if !waitFor(20*time.Second, func() bool { return bothWays(p) }) {
		t.Fatal("no traffic through the tunnel before the events")
	}

	// oneWay events run with traffic from A's side only: B's own traffic
	// would bring the tunnel back through its trap policy whatever A
	// knows, so only there does A's knowledge of B's deletes show.
	events := []struct {
		name   string
		do     func()
		oneWay bool
	}{
		{"espd on A killed", func() { p.a.killEspd(); p.a.restartEspd() }, false},
		{"espd on B killed", func() { p.b.killEspd(); p.b.restartEspd() }, false},
		{"charon on A restarted", func() { p.a.restartCharon(opts, ca, false) }, false},
		{"charon on B restarted", func() { p.b.restartCharon(opts, cb, false) }, false},
		{"charon on A killed", func() { p.a.restartCharon(opts, ca, true) }, false},
		{"charon on B killed", func() { p.b.restartCharon(opts, cb, true) }, false},
		{"B upgraded (espd and charon restarted together)", func() { p.b.upgrade(opts, cb) }, true},
		{"A upgraded (espd and charon restarted together)", func() { p.a.upgrade(opts, ca) }, false},
	}
	var gaps []string
	for _, ev := range events {
		passes := func() bool { return bothWays(p) }
		if ev.oneWay {
			fromServer.Stop(5 * time.Second)
			passes = func() bool { return oneWay(p) }
		}
		start := time.Now()
		ev.do()
		done := time.Now()
		if !waitFor(60*time.Second, passes) {
			t.Fatalf("%s: no traffic within 60 s", ev.name)
		}
		gap, total := time.Since(done), time.Since(start)
		if ev.oneWay {
			fromServer = pinger(t, p.topo.Server, p.b.dir, testbed.ClientV4.Addr().String())
		}
		gaps = append(gaps, fmt.Sprintf("%s: %v after the commands returned (%v from their start)", ev.name,
			gap.Round(10*time.Millisecond), total.Round(10*time.Millisecond)))
		if gap > 5*time.Second {
			t.Errorf("%s: traffic passed again only %v after the commands returned, want within 5 s", ev.name, gap.Round(10*time.Millisecond))
		}
		time.Sleep(time.Second) // traffic flows for a while between events
	}
	t.Logf("until traffic passed both ways again:\n  %s", strings.Join(gaps, "\n  "))

	stopCaptureNoLeaks(t, capture, "the transit link over the whole sequence")
	capture = nil
	if n := p.a.charonLogCount("espd drops its traffic until charon installs it again"); n == 0 {
		t.Errorf("A: the plugin never said it kept a policy as a drop policy")
	}
}
