package e2e

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// hostToHost is a transport-mode association between the two gateways'
// own transit addresses, each end run by espd and keyed with espctl.
type hostToHost struct {
	top  *testbed.Topology
	a, b *espd
	// aAddr and bAddr are the hosts' addresses, the states' endpoints.
	aAddr, bAddr netip.Addr
	// aSAs and aPolicies are what gwA's espd was keyed with.
	aSAs      []saSpec
	aPolicies []policySpec
}

// newHostToHost starts espd on gwA and gwB and keys transport mode between
// their transit addresses of family c.outer: all their traffic to each
// other, in both directions. Both hosts filter by reverse path strictly
// (net.ipv4.conf.all.rp_filter=1), but for the loose filter that
// docs/transport.md asks for on the interface to the peer (and the TUN's,
// which espd sets loose).
func newHostToHost(t *testing.T, c outerCase) *hostToHost {
	t.Helper()
	kl := keyLens[c.suite]
	h := &hostToHost{top: newTopology(t, 0)}
	h.aAddr = testbed.Pick(c.outer, testbed.GwATransitV4.Addr(), testbed.GwATransitV6.Addr())
	h.bAddr = testbed.Pick(c.outer, testbed.GwBTransitV4.Addr(), testbed.GwBTransitV6.Addr())
	ctx := context.Background()
	for _, n := range []*testbed.Node{h.top.GwA, h.top.GwB} {
		for _, kv := range []string{"all.rp_filter=1", "default.rp_filter=1", testbed.IfTransit + ".rp_filter=2"} {
			if _, err := n.Run(ctx, "sysctl", "-qw", "net.ipv4.conf."+kv); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.a = startEspd(t, h.top.GwA)
	h.b = startEspd(t, h.top.GwB)
	for _, n := range []*testbed.Node{h.top.GwA, h.top.GwB} {
		out, err := n.Run(ctx, "sysctl", "-n", "net.ipv4.conf."+tunName+".rp_filter", "net.ipv4.conf.all.rp_filter")
		if err != nil || strings.Fields(out)[1] != "1" {
			t.Fatalf("%s: the TUN's and all's rp_filter: %q, %v; want all's strict", n.Role, out, err)
		}
	}
	abEnc, abInt := randKey(t, kl[0]), randKey(t, kl[1])
	baEnc, baInt := randKey(t, kl[0]), randKey(t, kl[1])
	sa := func(spi uint32, dir string, src, dst netip.Addr, enc, integ []byte) saSpec {
		return saSpec{spi: spi, dir: dir, src: src, dst: dst, suite: c.suite, encKey: enc, integKey: integ,
			reqid: 1, encap: c.encap, transport: true}
	}
	host := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }
	h.aSAs = []saSpec{sa(spiAB, "out", h.aAddr, h.bAddr, abEnc, abInt), sa(spiBA, "in", h.bAddr, h.aAddr, baEnc, baInt)}
	bSAs := []saSpec{sa(spiBA, "out", h.bAddr, h.aAddr, baEnc, baInt), sa(spiAB, "in", h.aAddr, h.bAddr, abEnc, abInt)}
	policies := func(self, peer netip.Addr) []policySpec {
		return []policySpec{{src: host(self), dst: host(peer), dir: "out", action: "protect", reqid: 1, transport: true},
			{src: host(peer), dst: host(self), dir: "in", action: "protect", reqid: 1, transport: true}}
	}
	h.aPolicies = policies(h.aAddr, h.bAddr)
	keyAllSeq(t, h.a, h.aSAs, h.aPolicies)
	keyAllSeq(t, h.b, bSAs, policies(h.bAddr, h.aAddr))
	return h
}

// checkHostTransit requires a complete capture of the transit link that
// holds nothing between the two hosts but their ESP (raw or in UDP, whole
// or in fragments) with the association's SPIs ab and ba: no TCP, UDP or
// ICMP of theirs in clear, in either direction.
func checkHostTransit(t *testing.T, res *testbed.CaptureResult, encap bool, minBytes int, ab, ba uint32) {
	t.Helper()
	if !res.Complete() {
		t.Errorf("the capture missed frames: %s", res.Summary())
	}
	want := testbed.ClassESP
	if encap {
		want = testbed.ClassESPInUDP
	}
	var espBytes, frags, shown int
	spis := map[uint32]int{}
	for i := range res.Frames {
		f := &res.Frames[i]
		switch {
		case f.Class == want:
			espBytes += f.Len
			if f.Fragment {
				frags++
			}
			if !f.Fragment || f.FirstFragment {
				spis[f.SPI]++
			}
		case f.Class == testbed.ClassLink:
		case f.Class == testbed.ClassKeepalive && encap:
		default:
			if shown < 10 {
				t.Errorf("cleartext or unexpected frame on transit: %s", f.String())
			}
			shown++
		}
	}
	if shown > 10 {
		t.Errorf("... %d such frames in all", shown)
	}
	for spi, n := range spis {
		if spi != ab && spi != ba {
			t.Errorf("ESP with SPI 0x%x on transit (%d frames)", spi, n)
		}
	}
	if spis[ab] == 0 || spis[ba] == 0 {
		t.Errorf("SPIs on transit: %v, want both 0x%x and 0x%x", spis, ab, ba)
	}
	if frags == 0 {
		t.Error("no ESP fragments on transit: the 9,216-byte datagrams did not travel whole in one ESP packet each")
	}
	if espBytes < minBytes {
		t.Errorf("only %d bytes of %s on transit, want at least %d", espBytes, want, minBytes)
	}
}

// bigDatagrams sends count UDP datagrams of 9,216 bytes from one host to
// the other (fragmented on the way) and requires every one to arrive
// whole.
func bigDatagrams(t *testing.T, ctx context.Context, from, to *testbed.Node, dst netip.Addr, count int) {
	t.Helper()
	r, err := to.ListenUDP(netip.AddrPortFrom(dst, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Paced: a burst of datagrams 7 fragments each can overrun a veth
	// queue, and the test is about what arrives, not how fast.
	if _, err := from.SendUDP(ctx, r.Addr(), testbed.UDPSendOptions{Size: 9216, Count: count, Interval: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.WaitPackets(wctx, uint64(count)); err != nil {
		t.Fatalf("%s to %s: %d of %d datagrams of 9216 bytes arrived: %v", from.Role, to.Role, r.Packets(), count, err)
	}
	for _, n := range r.Sizes() {
		if n != 9216 {
			t.Fatalf("%s to %s: a datagram of %d bytes arrived, want 9216", from.Role, to.Role, n)
		}
	}
}

// hostTraffic pings from each host to the other, runs a TCP transfer each
// way at once, and sends datagrams of 9,216 bytes each way: everything
// must arrive.
func hostTraffic(t *testing.T, ctx context.Context, top *testbed.Topology, aAddr, bAddr netip.Addr) {
	t.Helper()
	for _, p := range []struct {
		from *testbed.Node
		dst  netip.Addr
	}{{top.GwA, bAddr}, {top.GwB, aAddr}} {
		r, err := p.from.Ping(ctx, p.dst, testbed.PingOptions{Count: 3})
		if err != nil || !r.OK() {
			t.Fatalf("ping %v from %s: %v\n%s", p.dst, p.from.Role, err, r.Output)
		}
	}
	var wg sync.WaitGroup
	for i, dir := range []struct {
		from, to *testbed.Node
		dst      netip.Addr
	}{{top.GwA, top.GwB, bAddr}, {top.GwB, top.GwA, aAddr}} {
		wg.Go(func() {
			r, err := testbed.Transfer(ctx, testbed.TransferOptions{From: dir.from, To: dir.to, Dst: dir.dst,
				Bytes: smallTransfer, Timeout: 120 * time.Second, Seed: uint64(i) + 1})
			if err != nil {
				t.Errorf("TCP %s to %s: %v (%v)", dir.from.Role, dir.to.Role, err, r)
				return
			}
			t.Logf("TCP %s to %s: %v", dir.from.Role, dir.to.Role, r)
		})
	}
	wg.Wait()
	bigDatagrams(t, ctx, top.GwA, top.GwB, bAddr, 20)
	bigDatagrams(t, ctx, top.GwB, top.GwA, aAddr, 20)
}

// TestHostToHost: two hosts, each running espd, protect all their traffic
// to each other in transport mode (IPv4 and IPv6, raw ESP and ESP-in-UDP):
// a ping and a TCP transfer each way, at once, and datagrams of 9,216
// bytes each way arrive whole, with strict reverse-path filtering on, and
// a capture of the link between them shows nothing of theirs but ESP, in
// fragments for the big datagrams. Then one host's espd is killed: its
// traffic to the other stays held, nothing leaves in clear.
func TestHostToHost(t *testing.T) {
	for _, c := range []outerCase{
		{testbed.IPv4, false, "aes128gcm16"},
		{testbed.IPv6, true, "aes256-sha1"},
		{testbed.IPv4, true, "aes128-sha256"},
		{testbed.IPv6, false, "chacha20poly1305"},
	} {
		t.Run(c.name(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			h := newHostToHost(t, c)
			capt, err := h.top.GwB.StartCapture(testbed.IfTransit, testbed.CaptureOptions{})
			if err != nil {
				t.Fatal(err)
			}
			stopped := false
			defer func() {
				if !stopped {
					capt.Stop()
				}
			}()
			hostTraffic(t, ctx, h.top, h.aAddr, h.bAddr)
			stopped = true
			res, err := capt.Stop()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("transit capture at gwB: %s", res.Summary())
			checkHostTransit(t, res, c.encap, 2*smallTransfer+2*20*9216, spiAB, spiBA)
			// The inbound states counted what they took and refused none
			// of it; both ends show the states' mode.
			for _, s := range []struct {
				e   *espd
				spi uint32
				dst netip.Addr
			}{{h.b, spiAB, h.bAddr}, {h.a, spiBA, h.aAddr}} {
				if n := s.e.saCounter(t, s.spi, s.dst, cntPackets...); n < smallTransfer/9216 {
					t.Errorf("%s: inbound state 0x%x counted %d packets", s.e.node.Role, s.spi, n)
				}
				for _, c := range [][]string{cntReplay, cntIntegrity} {
					if n := s.e.saCounter(t, s.spi, s.dst, c...); n != 0 {
						t.Errorf("%s: inbound state 0x%x: %v = %d", s.e.node.Role, s.spi, c, n)
					}
				}
				if out := s.e.mustCtl(t, saGetArgs("get", s.spi, s.dst)...); !strings.Contains(out, "transport") {
					t.Errorf("%s: sa get does not show transport mode:\n%s", s.e.node.Role, out)
				}
			}

			// Fail closed: with gwA's espd gone, gwA's traffic to gwB is
			// held, not sent in clear.
			h.a.kill(t)
			capt2, err := h.top.GwB.StartCapture(testbed.IfTransit, testbed.CaptureOptions{})
			if err != nil {
				t.Fatal(err)
			}
			h.top.GwA.SendUDP(ctx, netip.AddrPortFrom(h.bAddr, 9), testbed.UDPSendOptions{Count: 5, Size: 100})
			h.top.GwA.SendUDP(ctx, netip.AddrPortFrom(h.bAddr, 9), testbed.UDPSendOptions{Count: 2, Size: 9216})
			h.top.GwA.Ping(ctx, h.bAddr, testbed.PingOptions{Count: 2})
			res2, err := capt2.Stop()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range res2.Frames {
				if f.Class != testbed.ClassLink && (f.Class != testbed.ClassKeepalive || !c.encap) {
					t.Errorf("with gwA's espd killed, on transit: %s", f.String())
				}
			}
		})
	}
}

// sendFromPort sends one datagram of n bytes from the node's port sport
// (its address src) to dst.
func sendFromPort(t *testing.T, node *testbed.Node, src netip.Addr, sport uint16, dst netip.AddrPort, n int) {
	t.Helper()
	err := node.Do(func() error {
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, sport)), net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(make([]byte, n))
		return err
	})
	if err != nil {
		t.Fatalf("udp from %s port %d to %v: %v", node.Role, sport, dst, err)
	}
}

// TestTransportPorts: transport mode for L2TP's udp/1701 only, as charon
// installs it for an L2TP/IPsec client. Datagrams between the two hosts'
// ports 1701 cross as ESP, both ways and in fragments; a datagram to
// another port, which the policies do not cover but the route to the peer
// takes into the TUN, is dropped and counted, never sent in clear.
func TestTransportPorts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	top := newTopology(t, 0)
	aAddr, bAddr := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	a := startEspd(t, top.GwA, "--metrics-listen="+metricsAddr)
	b := startEspd(t, top.GwB, "--metrics-listen="+metricsAddr)
	kl := keyLens["aes128gcm16"]
	abEnc, baEnc := randKey(t, kl[0]), randKey(t, kl[0])
	sa := func(spi uint32, dir string, src, dst netip.Addr, enc []byte) saSpec {
		return saSpec{spi: spi, dir: dir, src: src, dst: dst, suite: "aes128gcm16", encKey: enc, reqid: 1, transport: true}
	}
	host := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, 32) }
	a.addSA(t, sa(spiAB, "out", aAddr, bAddr, abEnc))
	a.addSA(t, sa(spiBA, "in", bAddr, aAddr, baEnc))
	b.addSA(t, sa(spiBA, "out", bAddr, aAddr, baEnc))
	b.addSA(t, sa(spiAB, "in", aAddr, bAddr, abEnc))
	for _, e := range []struct {
		d          *espd
		self, peer netip.Addr
	}{{a, aAddr, bAddr}, {b, bAddr, aAddr}} {
		for _, dir := range []string{"out", "in"} {
			src, dst := e.self, e.peer
			if dir == "in" {
				src, dst = dst, src
			}
			e.d.addPolicy(t, policySpec{src: host(src), dst: host(dst), dir: dir, action: "protect", reqid: 1,
				transport: true, proto: "udp", sport: 1701, dport: 1701})
		}
	}
	capt, err := top.GwB.StartCapture(testbed.IfTransit, testbed.CaptureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			capt.Stop()
		}
	}()
	// udp/1701 both ways, one datagram in fragments each way.
	for _, d := range []struct {
		from, to   *testbed.Node
		src, dst   netip.Addr
		sizes      []int
		wantPacket uint64
	}{{top.GwA, top.GwB, aAddr, bAddr, []int{200, 5000}, 2}, {top.GwB, top.GwA, bAddr, aAddr, []int{300, 6000}, 2}} {
		r, err := d.to.ListenUDP(netip.AddrPortFrom(d.dst, 1701))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range d.sizes {
			sendFromPort(t, d.from, d.src, 1701, r.Addr(), n)
		}
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		err = r.WaitPackets(wctx, d.wantPacket)
		wcancel()
		r.Close()
		if err != nil {
			t.Fatalf("udp/1701 %s to %s: %d of %d datagrams arrived: %v", d.from.Role, d.to.Role, r.Packets(), d.wantPacket, err)
		}
	}
	// Another port: into the TUN, no policy, dropped and counted.
	before, err := scrapeMetric(top.GwA, "espd_dataplane_no_policy_total")
	if err != nil {
		t.Fatal(err)
	}
	sendFromPort(t, top.GwA, aAddr, 5000, netip.AddrPortFrom(bAddr, 5000), 100)
	if !testbed.Poll(20*time.Second, 50*time.Millisecond, func() bool {
		n, err := scrapeMetric(top.GwA, "espd_dataplane_no_policy_total")
		return err == nil && n >= before+1
	}) {
		t.Error("the datagram to port 5000 was not counted as matching no policy")
	}
	stopped = true
	res, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("transit capture at gwB: %s", res.Summary())
	checkHostTransit(t, res, false, 200+5000+300+6000, spiAB, spiBA)
}
