package strongswantest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestRouteBasedRefused: what charon asks for that espd does not honour
// fails the CHILD_SA, loudly, instead of being ignored: marks
// (mark_in/mark_out, VTI style) and an interface restriction, which espd
// would turn into a policy for all of the gateway's matching traffic,
// hardware offload and copy_dscp = yes. swanctl --initiate fails, charon
// logs why at its default level (naming the setting and the docs'
// section), and espd holds no state and no policy of it. Interface IDs
// (if_id_in/if_id_out, XFRM-interface style) are not refused: the plugin
// passes them to espd, which keeps route-based tunnels apart by them.
func TestRouteBasedRefused(t *testing.T) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{})
	for _, c := range []struct {
		name, child, log string
	}{
		{"mark", "        mark_in = 42\n        mark_out = 42", "marks (mark_in, mark_out, set_mark_in, set_mark_out) are not supported by espd"},
		{"interface", "        interface = wan0", "an interface restriction (interface) is not supported by espd"},
		{"hw_offload", "        hw_offload = yes", "hw_offload = yes; espd does the crypto itself"},
		{"copy_dscp", "        copy_dscp = yes", "refused: copy_dscp = yes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ca, cb := v4("aes128gcm16")
			ca.Child, cb.Child = c.child, c.child
			p.load(ca, cb)
			before := p.a.charonLogCount(c.log) + p.b.charonLogCount(c.log)
			out, err := p.a.swanctl("--initiate", "--child", "net", "--timeout", "20")
			if err == nil {
				t.Errorf("swanctl --initiate succeeded with %q:\n%s", c.child, out)
			}
			if !waitFor(10*time.Second, func() bool { return p.a.charonLogCount(c.log)+p.b.charonLogCount(c.log) > before }) {
				t.Errorf("charon did not log %q", c.log)
			}
			for _, g := range []*gateway{p.a, p.b} {
				s := g.espdSPIs()
				if len(s["in"])+len(s["out"]) > 0 || g.espdPolicies() > 0 {
					t.Errorf("%s: espd holds state of the refused CHILD_SA:\n%s\n%s", g.name, g.mustEspctl("sa", "list"), g.mustEspctl("policy", "list"))
				}
			}
			if strings.Contains(p.a.tunnelRoutes()+p.b.tunnelRoutes(), "198.18") {
				t.Errorf("espd routes into its TUN for a refused CHILD_SA: %q %q", p.a.tunnelRoutes(), p.b.tunnelRoutes())
			}
			p.a.swanctl("--terminate", "--ike", "s2s", "--timeout", "10")
		})
	}
}

// routeBasedConf is a gateway's swanctl.conf for route-based tunnels to
// remote: a connection rbN per interface ID N, each with its own IKE
// identities (a responder picks a CHILD_SA config by traffic selectors, so
// two route-based CHILD_SAs with the same ones need IKE_SAs of their own)
// and one CHILD_SA rbN, 0/0 === 0/0 and ::/0 === ::/0 with if_id_in =
// if_id_out = N. side is "a" or "b"; child holds more lines for each
// CHILD_SA section.
func routeBasedConf(local, remote, side, child string, ids ...int) string {
	other := map[string]string{"a": "b", "b": "a"}[side]
	var b strings.Builder
	b.WriteString("connections {\n")
	for _, id := range ids {
		fmt.Fprintf(&b, "  rb%d {\n    version = 2\n    local_addrs = %s\n    remote_addrs = %s\n", id, local, remote)
		b.WriteString("    proposals = aes128-sha256-x25519\n    dpd_delay = 0\n")
		fmt.Fprintf(&b, "    local {\n      auth = psk\n      id = rb%d-%s.espd.test\n    }\n    remote {\n      auth = psk\n      id = rb%d-%s.espd.test\n    }\n", id, side, id, other)
		fmt.Fprintf(&b, "    children {\n      rb%d {\n        local_ts = 0.0.0.0/0, ::/0\n        remote_ts = 0.0.0.0/0, ::/0\n", id)
		fmt.Fprintf(&b, "        if_id_in = %d\n        if_id_out = %d\n        esp_proposals = aes128gcm16\n%s\n      }\n    }\n  }\n", id, id, child)
	}
	b.WriteString("}\nsecrets {\n")
	for _, id := range ids {
		fmt.Fprintf(&b, "  ike-rb%d {\n    id-a = rb%d-a.espd.test\n    id-b = rb%d-b.espd.test\n    secret = %s\n  }\n", id, id, id, psk)
	}
	b.WriteString("}\n")
	return b.String()
}

// routeBasedEspdConf writes an espd configuration file with a route-based
// interface per ID (ipsecN, if_id N) into the gateway's directory and
// returns its path.
func (g *gateway) routeBasedEspdConf(ids ...int) string {
	g.t.Helper()
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "[[interface]]\nname = \"ipsec%d\"\nif_id = %d\n\n", id, id)
	}
	path := filepath.Join(g.dir, "espd.toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		g.t.Fatal(err)
	}
	return path
}

// ifPackets returns the packets counted on espd's states of direction dir
// ("in" or "out") and interface ID ifID (0: policy-based), from espctl sa
// list.
func (g *gateway) ifPackets(dir string, ifID int) int {
	g.t.Helper()
	out := g.mustEspctl("sa", "list")
	n := 0
	for _, block := range strings.Split(out, "\nspi ") {
		head, _, _ := strings.Cut(block, "\n")
		if !strings.Contains(head, "dir "+dir) {
			continue
		}
		if id := fmt.Sprintf(" if_id %d", ifID); ifID == 0 && strings.Contains(head, " if_id ") || ifID != 0 && !strings.Contains(head+" ", id+" ") {
			continue
		}
		if m := regexp.MustCompile(`(\d+) packets`).FindStringSubmatch(block); m != nil {
			v, _ := strconv.Atoi(m[1])
			n += v
		}
	}
	return n
}

// TestRouteBasedTwoInterfaces: two route-based CHILD_SAs between A and B,
// both 0/0 === 0/0 (and ::/0), on if_id 1 and if_id 2, coexist, and each
// carries only what the routes send into its interface: routing LAN B
// into ipsec1 uses the if_id 1 states, re-routing it into ipsec2 the
// if_id 2 states. The gateways' own traffic to each other's transit
// address, which no route sends into an interface, passes in clear as it
// did before (the gateway is not swallowed). Deleting the if_id 2 CHILD_SA
// leaves if_id 1 working; with espd killed on A the interfaces stay, what
// is routed into them is dropped (no cleartext on the transit link) and
// A still reaches B's transit address; espd back, the tunnels come back.
func TestRouteBasedTwoInterfaces(t *testing.T) {
	requireStrongSwan(t)
	topo := testbed.NewT(t, testbed.Options{Prefix: "srb"})
	p := &pair{topo: topo, a: newGateway(t, topo.GwA, "A"), b: newGateway(t, topo.GwB, "B")}
	p.a.startEspd("--config", p.a.routeBasedEspdConf(1, 2))
	p.b.startEspd("--config", p.b.routeBasedEspdConf(1, 2))
	opts := charonOptions{}
	p.a.startCharon(opts)
	p.b.startCharon(opts)
	ctx := context.Background()
	for _, g := range []*gateway{p.a, p.b} {
		for _, ifc := range []string{"ipsec1", "ipsec2"} {
			if _, err := g.node.IP(ctx, "link", "show", ifc); err != nil {
				t.Fatalf("%s: interface %s missing: %v", g.name, ifc, err)
			}
		}
	}
	aT, bT := testbed.GwATransitV4.Addr().String(), testbed.GwBTransitV4.Addr().String()
	// A keeps its tunnels up as docs/strongswan.md says: start_action
	// and close_action start.
	p.b.load(routeBasedConf(bT, aT, "b", "", 1, 2))
	p.a.load(routeBasedConf(aT, bT, "a", "        start_action = start\n        close_action = start", 1, 2))
	p.b.waitChild("rb1", 10*testSecond)
	p.b.waitChild("rb2", 10*testSecond)

	capture, err := topo.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 256})
	if err != nil {
		t.Fatal(err)
	}
	route := func(ifc string) {
		t.Helper()
		topo.GwA.MustIP(t, "-4", "route", "replace", testbed.LANBV4.String(), "dev", ifc)
		topo.GwB.MustIP(t, "-4", "route", "replace", testbed.LANAV4.String(), "dev", ifc)
	}
	// Nothing routed into the interfaces yet: the LANs' traffic takes the
	// main table's routes? There are none (no RouteLANs): no path at all.
	// Each interface carries what is routed into it, and nothing else:
	// 20 pings through ipsec1 move the if_id 1 states only (the kernel's
	// own IPv6 link-local chatter on an interface may add a packet or
	// two to its states).
	through := func(ifc string, id, other int) {
		t.Helper()
		route(ifc)
		if !waitFor(10*time.Second, func() bool { return bothWays(p) }) {
			t.Fatalf("no traffic through %s\nA: %s\nB: %s", ifc, p.a.mustEspctl("sa", "list"), p.b.mustEspctl("sa", "list"))
		}
		out, otherOut, in := p.a.ifPackets("out", id), p.a.ifPackets("out", other), p.b.ifPackets("in", id)
		r, err := topo.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 20, Interval: 10 * time.Millisecond, Wait: 2 * time.Second})
		if err != nil || r.Received != 20 {
			t.Fatalf("20 pings through %s: %+v %v", ifc, r, err)
		}
		if d := p.a.ifPackets("out", id) - out; d < 20 {
			t.Errorf("20 pings through %s: A's if_id %d state sent %d more", ifc, id, d)
		}
		if d := p.b.ifPackets("in", id) - in; d < 20 {
			t.Errorf("20 pings through %s: B's if_id %d state received %d more", ifc, id, d)
		}
		if d := p.a.ifPackets("out", other) - otherOut; d >= 5 {
			t.Errorf("20 pings through %s: A's if_id %d state sent %d more", ifc, other, d)
		}
	}
	through("ipsec1", 1, 2)
	through("ipsec2", 2, 1)
	// The gateways' own traffic is not in any policy's way.
	if r, err := topo.GwA.Ping(ctx, testbed.GwBTransitV4.Addr(), testbed.PingOptions{Count: 1, Wait: 2 * time.Second}); err != nil || !r.OK() {
		t.Errorf("A cannot reach B's transit address: %v %v", r, err)
	}
	if out := topo.GwA.MustIP(t, "route", "get", bT); strings.Contains(out, "ipsec") || strings.Contains(out, tunName) {
		t.Errorf("A routes B's transit address into espd: %s", out)
	}

	// The if_id 2 tunnel goes (terminated on A, whose close_action does
	// not apply to its own terminate): its interface drops, ipsec1
	// carries on.
	p.a.mustSwanctl("--terminate", "--ike", "rb2", "--timeout", "10")
	if waitFor(3*time.Second, func() bool { return oneWay(p) }) {
		t.Error("traffic still crosses ipsec2 with its CHILD_SA deleted")
	}
	route("ipsec1")
	if !waitFor(10*time.Second, func() bool { return bothWays(p) }) {
		t.Error("ipsec1 stopped working when the if_id 2 CHILD_SA was deleted")
	}

	// espd killed on A: the interfaces and their routes stay and drop.
	pinger(t, topo.Client, p.a.dir, testbed.ServerV4.Addr().String())
	p.a.killEspd()
	for _, ifc := range []string{"ipsec1", "ipsec2"} {
		if _, err := topo.GwA.IP(ctx, "link", "show", ifc); err != nil {
			t.Errorf("interface %s gone with espd: %v", ifc, err)
		}
	}
	if r, err := topo.GwA.Ping(ctx, testbed.GwBTransitV4.Addr(), testbed.PingOptions{Count: 1, Wait: 2 * time.Second}); err != nil || !r.OK() {
		t.Errorf("with espd stopped, A cannot reach B's transit address: %v %v", r, err)
	}
	if waitFor(2*time.Second, func() bool { return oneWay(p) }) {
		t.Error("traffic crosses with espd killed")
	}
	p.a.restartEspd()
	if !waitFor(20*time.Second, func() bool { return bothWays(p) }) {
		t.Error("no traffic through ipsec1 after espd's restart")
	}
	stopCaptureNoLeaks(t, capture, "route-based tunnels")
}

// TestRouteBasedDocsExample runs docs/strongswan.md's "Route-based
// tunnels" as written on gateway A (the interface in espd.toml, the
// swanctl.conf with if_id, the route into the interface), against its
// mirror image on B, and checks that the LANs reach each other through
// it and that no cleartext of theirs crosses the transit link.
func TestRouteBasedDocsExample(t *testing.T) {
	requireStrongSwan(t)
	espdConf := docExample(t, "toml", "route-based espd.toml")
	swanConf := docExample(t, "conf", "route-based swanctl.conf")
	routes := docExample(t, "sh", "route-based routes")
	for _, want := range []string{"local_addrs = " + testbed.GwATransitV4.Addr().String(),
		"remote_addrs = " + testbed.GwBTransitV4.Addr().String(), "if_id_in = 1", "if_id_out = 1"} {
		if !strings.Contains(swanConf, want) {
			t.Fatalf("the docs' route-based example lacks %q; update the test:\n%s", want, swanConf)
		}
	}
	topo := testbed.NewT(t, testbed.Options{Prefix: "srd"})
	p := &pair{topo: topo, a: newGateway(t, topo.GwA, "A"), b: newGateway(t, topo.GwB, "B")}
	aPath := filepath.Join(p.a.dir, "espd.toml")
	if err := os.WriteFile(aPath, []byte(espdConf), 0o600); err != nil {
		t.Fatal(err)
	}
	p.a.startEspd("--config", aPath)
	p.b.startEspd("--config", p.b.routeBasedEspdConf(1))
	p.a.startCharon(charonOptions{})
	p.b.startCharon(charonOptions{})
	capture, err := topo.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 256})
	if err != nil {
		t.Fatal(err)
	}
	aT, bT := testbed.GwATransitV4.Addr().String(), testbed.GwBTransitV4.Addr().String()
	secrets, key := docSecret(t, "route-based swanctl.conf secret")
	p.b.load(strings.ReplaceAll(routeBasedConf(bT, aT, "b", "", 1), psk, key))
	p.a.load(swanConf + secrets)
	p.a.waitChild("rb1", 20*testSecond)
	p.b.waitChild("rb1", 10*testSecond)
	n := 0
	for _, line := range strings.Split(routes, "\n") {
		if args, ok := strings.CutPrefix(strings.TrimSpace(line), "ip "); ok {
			topo.GwA.MustIP(t, strings.Fields(args)...)
			n++
		}
	}
	if n == 0 {
		t.Fatalf("the docs' routes block has no ip command:\n%s", routes)
	}
	topo.GwB.MustIP(t, "-4", "route", "add", testbed.LANAV4.String(), "dev", "ipsec1")
	if !waitFor(10*time.Second, func() bool { return bothWays(p) }) {
		t.Fatalf("no traffic through the docs' route-based tunnel\nA: %s", p.a.mustEspctl("sa", "list"))
	}
	if p.a.ifPackets("out", 1) == 0 || p.a.ifPackets("in", 1) == 0 {
		t.Errorf("A's if_id 1 states carried nothing:\n%s", p.a.mustEspctl("sa", "list"))
	}
	stopCaptureNoLeaks(t, capture, "the docs' route-based tunnel")
}
