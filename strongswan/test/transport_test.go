package strongswantest

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
)

// transportPeer is gateway B's side of the docs' transport-mode example
// ("transport host-to-host"): its mirror image.
const transportPeer = `connections {
    host-host {
        version = 2
        local_addrs = 198.18.2.2
        remote_addrs = 198.18.1.2
        proposals = aes128-sha256-x25519
        local {
            auth = psk
            id = host2.example.com
        }
        remote {
            auth = psk
            id = host1.example.com
        }
        children {
            host-host {
                mode = transport
                esp_proposals = aes128gcm16
                start_action = trap
            }
        }
    }
}
secrets {
    ike-host-host {
        id-1 = host1.example.com
        id-2 = host2.example.com
        secret = @PSK@
    }
}
`

// transportDatagram is the size of the UDP datagram that must cross a
// transport-mode SA whole: far above the link's MTU, so that the host hands
// it to espd in one piece (espd's route for a transport policy) and espd
// sends the ESP packet in outer fragments.
const transportDatagram = 9216

// newHostPair builds the topology with the LANs routed over the transit
// link and runs espd and charon on the client (host A) and the server
// (host B): two hosts with one address each, whose traffic crosses gwA and
// gwB as plain routers.
func newHostPair(t *testing.T) *pair {
	t.Helper()
	topo := testbed.NewT(t, testbed.Options{Prefix: "sst", RouteLANs: true})
	p := &pair{topo: topo, a: newGateway(t, topo.Client, "A"), b: newGateway(t, topo.Server, "B")}
	p.a.startEspd()
	p.b.startEspd()
	p.a.startCharon(charonOptions{})
	p.b.startCharon(charonOptions{})
	return p
}

// TestTransport runs host-to-host transport mode (RFC 4303 3.1.1) between
// two hosts, the client and the server namespaces, with charon and espd on
// both and gwA and gwB routing between them: the docs' IPv4 example
// ("transport host-to-host", start_action = trap) as written on host A
// against its mirror on B, brought up by A's first ping; then an IPv6
// connection initiated from A, with tfc_padding, which a transport-mode SA
// goes without. Each time both CHILD_SAs must be in transport mode in
// charon and in espd, pings, TCP both ways and a UDP datagram of 9216
// bytes each way must cross whole, and the link between the routers must
// carry nothing but ESP (whole or in fragments), IKE and link
// housekeeping.
func TestTransport(t *testing.T) {
	requireStrongSwan(t)
	conf := docExample(t, "conf", "transport host-to-host")
	a, b := testbed.ClientV4.Addr(), testbed.ServerV4.Addr()
	for _, want := range []string{"local_addrs = " + a.String(), "remote_addrs = " + b.String(),
		"mode = transport", "start_action = trap"} {
		if !strings.Contains(conf, want) {
			t.Fatalf("the docs' transport-mode example lacks %q; update the test:\n%s", want, conf)
		}
	}
	p := newHostPair(t)

	t.Log("--- IPv4, the docs' example")
	secrets, key := docSecret(t, "transport host-to-host secret")
	p.b.load(withPSK(transportPeer, key))
	p.a.load(conf + secrets)
	if !waitFor(5*time.Second, func() bool { return p.a.espdPolicies() >= 2 && p.b.espdPolicies() >= 2 }) {
		t.Fatalf("trap policies not in espd:\n%s\n%s", p.a.mustEspctl("policy", "list"), p.b.mustEspctl("policy", "list"))
	}
	capture := startTransitCapture(t, p.topo.GwA)
	// A's first packets raise the acquire; the CHILD_SA comes up.
	first, err := p.topo.Client.Ping(context.Background(), b, testbed.PingOptions{Count: 10, Interval: 200 * time.Millisecond, Wait: time.Second})
	t.Logf("pings while the CHILD_SA came up: %d of %d answered (%v)", first.Received, first.Transmitted, err)
	p.a.waitChild("host-host", 15*time.Second)
	p.b.waitChild("host-host", 10*time.Second)
	if p.a.charonLogCount("acquire") == 0 {
		t.Errorf("A: charon logged no acquire")
	}
	checkTransportSAs(t, p.a, "host-host", a, b)
	checkTransportSAs(t, p.b, "host-host", b, a)
	transportTraffic(t, p.topo.Client, p.topo.Server, a, b)
	checkTransportCapture(t, capture, false)
	// The traps stay when the CHILD_SA goes; uninstalling them and
	// unloading the connection leaves nothing.
	p.a.mustSwanctl("--terminate", "--ike", "host-host", "--timeout", "10")
	for _, g := range []*gateway{p.a, p.b} {
		g.mustSwanctl("--uninstall", "--child", "host-host")
		checkEmpty(t, g)
	}

	t.Log("--- IPv6, tfc_padding")
	a6, b6 := testbed.ClientV6.Addr(), testbed.ServerV6.Addr()
	child := "        mode = transport\n        tfc_padding = 1500"
	p.load(connection{Local: a6.String(), Remote: b6.String(), LocalTS: "dynamic", RemoteTS: "dynamic", ESP: "chacha20poly1305", Child: child},
		connection{Local: b6.String(), Remote: a6.String(), LocalTS: "dynamic", RemoteTS: "dynamic", ESP: "chacha20poly1305", Child: child})
	capture = startTransitCapture(t, p.topo.GwA)
	p.initiate()
	checkTransportSAs(t, p.a, "net", a6, b6)
	checkTransportSAs(t, p.b, "net", b6, a6)
	if p.a.charonLogCount("tfc_padding applies to tunnel mode only") == 0 {
		t.Errorf("A: the plugin did not say that the transport-mode SA goes without tfc_padding")
	}
	transportTraffic(t, p.topo.Client, p.topo.Server, a6, b6)
	checkTransportCapture(t, capture, false)
	p.a.mustSwanctl("--terminate", "--ike", "s2s", "--timeout", "10")
	checkEmpty(t, p.a)
	checkEmpty(t, p.b)
}

// TestTransportRefused initiates host-to-host CHILD_SAs that espd cannot
// carry, BEET mode and AH: each fails, charon says why, and espd holds
// nothing of it. charon negotiates BEET (a private notify of strongSwan's)
// only with a peer that it knows runs strongSwan: both send their vendor
// ID.
func TestTransportRefused(t *testing.T) {
	requireStrongSwan(t)
	vendor := charonOptions{Extra: "charon {\n  send_vendor_id = yes\n}\n"}
	p := newPair(t, pairOptions{A: vendor, B: vendor})
	a, b := testbed.GwATransitV4.Addr().String(), testbed.GwBTransitV4.Addr().String()
	for _, c := range []struct {
		name, esp, child, log string
	}{
		{"beet", "aes128gcm16", "        mode = beet", "refused: mode BEET; espd carries ESP in tunnel or transport mode only"},
		// An AH CHILD_SA has no esp_proposals.
		{"ah", "", "        mode = transport\n        ah_proposals = sha256", "refused: AH; espd carries ESP only"},
	} {
		t.Logf("--- %s", c.name)
		p.load(connection{Local: a, Remote: b, LocalTS: "dynamic", RemoteTS: "dynamic", ESP: c.esp, Child: c.child},
			connection{Local: b, Remote: a, LocalTS: "dynamic", RemoteTS: "dynamic", ESP: c.esp, Child: c.child})
		before := p.a.charonLogCount(c.log) + p.b.charonLogCount(c.log)
		if out, err := p.a.swanctl("--initiate", "--child", "net", "--timeout", "20"); err == nil {
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
		p.a.swanctl("--terminate", "--ike", "s2s", "--timeout", "10")
		// Whatever went wrong, the next case starts from nothing.
		for _, g := range []*gateway{p.a, p.b} {
			g.load("")
			if !waitFor(10*time.Second, func() bool { return g.espdPolicies() == 0 }) {
				t.Fatalf("%s: policies left after unloading the connection:\n%s", g.name, g.mustEspctl("policy", "list"))
			}
		}
	}
}

// checkTransportSAs checks that g's CHILD_SA child is in transport mode
// in charon, and that espd holds its two states in transport mode between
// the host's own address local and the peer's address remote, and its
// protect policies with transport-mode templates (read with the control
// protocol's client: sa.Config.Mode and sa.Policy.Mode).
func checkTransportSAs(t *testing.T, g *gateway, child string, local, remote netip.Addr) {
	t.Helper()
	c, ok := g.installedChild(child)
	if !ok || c.Mode != "TRANSPORT" {
		t.Fatalf("%s: CHILD_SA %s not installed in transport mode: %+v\n%s", g.name, child, c, g.mustSwanctl("--list-sas"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := control.Dial(ctx, g.sock)
	if err != nil {
		t.Fatalf("%s: %v", g.name, err)
	}
	defer cl.Close()
	states, err := cl.ListSAs(ctx)
	if err != nil {
		t.Fatalf("%s: %v", g.name, err)
	}
	pols, err := cl.ListPolicies(ctx)
	if err != nil {
		t.Fatalf("%s: %v", g.name, err)
	}
	listing := g.mustEspctl("sa", "list") + g.mustEspctl("policy", "list")
	n := 0
	for _, s := range states {
		if s.Stats.State == sa.StateLarval {
			continue
		}
		n++
		if s.Config.Mode != sa.ModeTransport {
			t.Errorf("%s: espd's state 0x%08x is in %v mode, want transport:\n%s", g.name, s.Config.SPI, s.Config.Mode, listing)
		}
	}
	if n != 2 {
		t.Errorf("%s: espd has %d states, want the CHILD_SA's two:\n%s", g.name, n, listing)
	}
	checkPulseEndpoints(t, g, local, remote, "transport mode")
	protect := 0
	for _, p := range pols {
		if p.Action != sa.ActionProtect {
			continue
		}
		protect++
		if p.Mode != sa.ModeTransport {
			t.Errorf("%s: espd's policy %v has a %v-mode template, want transport:\n%s", g.name, p, p.Mode, listing)
		}
	}
	if protect < 2 {
		t.Errorf("%s: espd has %d protect policies, want the CHILD_SA's in and out ones:\n%s", g.name, protect, listing)
	}
	t.Logf("%s: espd holds\n%s", g.name, listing)
}

// transportTraffic sends pings, TCP both ways and a 9216-byte UDP datagram
// each way between host a on node na and host b on node nb, and checks
// that all of it arrives.
func transportTraffic(t *testing.T, na, nb *testbed.Node, a, b netip.Addr) {
	t.Helper()
	ctx := context.Background()
	res, err := na.Ping(ctx, b, testbed.PingOptions{Count: 5})
	if err != nil || !res.OK() {
		t.Fatalf("pings %v -> %v in transport mode: %v\n%s", a, b, err, res.Output)
	}
	for _, d := range []struct {
		from, to *testbed.Node
		dst      netip.Addr
		n        int64
	}{{na, nb, b, 8 << 20}, {nb, na, a, 4 << 20}} {
		r, err := testbed.Transfer(ctx, testbed.TransferOptions{From: d.from, To: d.to, Dst: d.dst, Bytes: d.n, Timeout: 60 * time.Second, Seed: uint64(d.n)})
		if err != nil {
			t.Fatalf("TCP transfer %s -> %v: %v (%v)", d.from.Role, d.dst, err, r)
		}
		t.Logf("TCP %s -> %v: %v", d.from.Role, d.dst, r)
	}
	for _, d := range []struct {
		from, to    *testbed.Node
		listen, dst netip.Addr
	}{{na, nb, b, b}, {nb, na, a, a}} {
		sendBigDatagram(t, d.from, d.to, d.listen, d.dst)
	}
}

// sendBigDatagram sends one UDP datagram of transportDatagram bytes from
// node from to dst and checks that the receiver on to, listening on
// listen, gets it whole (retried a few times: one datagram may be lost).
func sendBigDatagram(t *testing.T, from, to *testbed.Node, listen, dst netip.Addr) {
	t.Helper()
	rcv, err := to.ListenUDP(netip.AddrPortFrom(listen, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	port := rcv.Addr().Port()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for try := 1; ; try++ {
		if _, err := from.SendUDP(ctx, netip.AddrPortFrom(dst, port), testbed.UDPSendOptions{Size: transportDatagram}); err != nil {
			t.Fatalf("sending %d bytes of UDP to %v: %v", transportDatagram, dst, err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		err := rcv.WaitPackets(wctx, 1)
		wcancel()
		if err == nil {
			break
		}
		if try == 3 {
			t.Fatalf("a UDP datagram of %d bytes %s -> %v did not arrive in %d tries: %v", transportDatagram, from.Role, dst, try, err)
		}
	}
	if sizes := rcv.Sizes(); !slices.Contains(sizes, transportDatagram) {
		t.Fatalf("UDP %s -> %v: datagrams of %v bytes arrived, want one of %d", from.Role, dst, sizes, transportDatagram)
	}
}

// startTransitCapture captures n's transit link until the test checks it.
func startTransitCapture(t *testing.T, n *testbed.Node) *testbed.Capture {
	t.Helper()
	c, err := n.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 128})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	return c
}

// checkTransportCapture stops a transit link's capture and checks what
// two hosts protecting their own traffic may put on it: ESP (raw, or in
// UDP when encap), whole or in fragments, IKE and NAT keepalives, link
// housekeeping, and nothing else: any other frame crossed in clear. The
// ESP must include fragments (the 9216-byte datagrams).
func checkTransportCapture(t *testing.T, c *testbed.Capture, encap bool) {
	t.Helper()
	res, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("transit link: %s", res.Summary())
	esp := testbed.ClassESP
	if encap {
		esp = testbed.ClassESPInUDP
	}
	// A NAT between the hosts refragments what it reassembled, writing
	// the new headers into the buffers of the fragments it received,
	// which on a veth pair are the buffers the capture on the other end
	// holds too: a fragment captured there can show the addresses the NAT
	// gave it later, no longer those of its first fragment, by which
	// testbed classifies it. So a later fragment of a datagram whose first
	// fragment (same IP ID, whatever the addresses) was ESP counts as ESP;
	// a datagram in clear still shows in its first fragment.
	espIDs := map[uint32]bool{}
	for _, f := range res.Frames {
		if f.Class == esp && f.Fragment && f.FirstFragment {
			espIDs[f.FragID] = true
		}
	}
	var espBytes, fragments, clear int
	for _, f := range res.Frames {
		if f.Class == testbed.ClassOther && f.Fragment && !f.FirstFragment && espIDs[f.FragID] {
			f.Class = esp
		}
		switch f.Class {
		case esp:
			espBytes += f.Len
			if f.Fragment {
				fragments++
			}
		case testbed.ClassIKE, testbed.ClassKeepalive, testbed.ClassLink:
		default:
			if clear < 10 {
				t.Errorf("frame in clear (or of the wrong ESP kind) on the transit link: %v at %v\n%x", &f, f.Time.Format("15:04:05.000000"), f.Data[:min(len(f.Data), 64)])
			}
			clear++
		}
	}
	if clear > 0 {
		t.Errorf("%d frames crossed the transit link outside ESP", clear)
	}
	if espBytes < 12<<20 {
		t.Errorf("only %d bytes of %v on the transit link, want the transfers' 12 MB", espBytes, esp)
	}
	if fragments == 0 {
		t.Errorf("no %v fragments on the transit link: the %d-byte datagrams did not go as fragmented ESP", esp, transportDatagram)
	}
	if !res.Complete() {
		t.Logf("the capture missed frames (%d drops, %d overflows)", res.Drops, res.Overflow)
	}
}
