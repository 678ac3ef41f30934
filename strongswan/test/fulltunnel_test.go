package strongswantest

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestRouteBasedPolicyFullTunnel: a policy-based full tunnel (no if_id:
// A's LAN === 0.0.0.0/0, B the hub) does what the kernel's XFRM does with
// it, with and without strongSwan's bypass-lan plugin on A: the LAN's
// traffic to anywhere goes through the tunnel, both ways, while the
// gateway's own traffic is left alone: its management access from a
// network it does not share with the peer (the server pings A's transit
// address: A answers from outside the LAN, straight back), its IKE and
// ESP, and, with bypass-lan, its own traffic to its LAN (the pass
// policies). With espd killed the LAN's traffic is dropped, not routed in
// clear, and the management access still works; espd back, the tunnel
// returns by itself. The transit capture shows no cleartext of the LANs.
func TestRouteBasedPolicyFullTunnel(t *testing.T) {
	requireStrongSwan(t)
	for _, bypassLAN := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "bypass-lan"}[bypassLAN], func(t *testing.T) {
			testPolicyFullTunnel(t, bypassLAN)
		})
	}
}

func testPolicyFullTunnel(t *testing.T, bypassLAN bool) {
	o := charonOptions{}
	if bypassLAN {
		o.Plugins = "bypass-lan"
	}
	p := newPair(t, pairOptions{A: o})
	ctx := context.Background()
	// Default routes that would carry any cleartext across the transit
	// link.
	p.topo.GwA.MustIP(t, "-4", "route", "add", "default", "via", testbed.GwBTransitV4.Addr().String())
	p.topo.GwB.MustIP(t, "-4", "route", "add", testbed.LANAV4.String(), "via", testbed.GwATransitV4.Addr().String())
	capture, err := p.topo.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 256})
	if err != nil {
		t.Fatal(err)
	}
	ca, cb := v4("aes128gcm16")
	ca.RemoteTS, cb.LocalTS = "0.0.0.0/0", "0.0.0.0/0"
	ca.StartAction, ca.Child = "start", "        close_action = start"
	p.b.load(cb.String())
	p.a.load(ca.String())
	p.a.waitChild("net", 20*testSecond)
	p.b.waitChild("net", 10*testSecond)
	if !waitFor(10*time.Second, func() bool { return bothWays(p) }) {
		t.Fatalf("no traffic through the full tunnel\nA: %s\n%s", p.a.mustEspctl("sa", "list"), p.a.mustEspctl("policy", "list"))
	}
	if pols := p.a.mustEspctl("policy", "list"); bypassLAN && !strings.Contains(pols, "action bypass") {
		t.Errorf("A: no bypass policy of bypass-lan in espd:\n%s", pols)
	}
	outA := func() int { return p.a.ifPackets("out", 0) }
	ping := func(n *testbed.Node, dst string) bool {
		r, err := n.Ping(ctx, netip.MustParseAddr(dst), testbed.PingOptions{Count: 3, Interval: 50 * time.Millisecond, Wait: 2 * time.Second})
		return err == nil && r.OK()
	}
	// The management station: a second address on the server's host, so
	// that its traffic, which crosses the transit link in clear as it
	// should, is not taken for the LANs' (the capture's leak check looks
	// for the client's and the server's addresses).
	mgmt := netip.MustParseAddr("198.18.2.99")
	p.topo.Server.MustIP(t, "addr", "add", mgmt.String()+"/24", "dev", testbed.IfHost)
	manage := func() bool {
		r, err := p.topo.Server.Ping(ctx, testbed.GwATransitV4.Addr(), testbed.PingOptions{Count: 3, Interval: 50 * time.Millisecond, Wait: 2 * time.Second, Source: mgmt})
		return err == nil && r.OK()
	}
	aT := testbed.GwATransitV4.Addr().String()
	// Management access from a network A does not share with B: A
	// answers from its transit address, outside the LAN, straight back.
	before := outA()
	if !manage() {
		t.Errorf("the management station cannot reach A's transit address with the full tunnel up")
	}
	if out := p.topo.GwA.MustIP(t, "route", "get", mgmt.String(), "from", aT); strings.Contains(out, tunName) {
		t.Errorf("A routes its own traffic from %s into espd: %s", aT, out)
	}
	if d := outA() - before; d != 0 {
		t.Errorf("A's answers to management access went through the tunnel: %d packets", d)
	}
	if bypassLAN {
		// A's own traffic to its LAN: bypass-lan's pass policy.
		before = outA()
		if !ping(p.topo.GwA, testbed.ClientV4.Addr().String()) {
			t.Errorf("A cannot reach its own LAN with the full tunnel up")
		}
		if d := outA() - before; d != 0 {
			t.Errorf("A's pings to its LAN went through the tunnel: %d packets", d)
		}
	}
	// The LAN's traffic still goes through it.
	before = outA()
	if !ping(p.topo.Client, testbed.ServerV4.Addr().String()) {
		t.Fatal("the client lost the tunnel")
	}
	if d := outA() - before; d < 3 {
		t.Errorf("3 pings from the LAN: A's outbound state sent %d", d)
	}

	// espd killed on A: the LAN is held, management is not.
	pinger(t, p.topo.Client, p.a.dir, testbed.ServerV4.Addr().String())
	p.a.killEspd()
	if !manage() {
		t.Errorf("with espd killed, the management station cannot reach A's transit address")
	}
	if oneWay(p) {
		t.Error("traffic crosses with espd killed")
	}
	p.a.restartEspd()
	if !waitFor(20*time.Second, func() bool { return bothWays(p) }) {
		t.Errorf("the full tunnel did not come back after espd's restart\nA: %s", p.a.mustEspctl("sa", "list"))
	}
	if !manage() {
		t.Errorf("after espd's restart, the management station cannot reach A's transit address")
	}
	stopCaptureNoLeaks(t, capture, "policy-based full tunnel")
}
