package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/routing"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// gateway is one side of the namespace test: a namespace with a Device.
type gateway struct {
	ns       *testbed.Node
	db       *sa.DB
	d        *Device
	router   *routing.Router
	outer4   netip.Addr
	outer6   netip.Addr
	inner4   netip.Addr // on lo, in the protected network
	inner6   netip.Addr
	policies []sa.Policy
}

func newGateway(t *testing.T, ns *testbed.Node, tunName string, outer4, outer6, inner4, inner6 string) *gateway {
	t.Helper()
	g := &gateway{
		ns: ns, db: sa.NewDB(sa.Options{}),
		outer4: netip.MustParseAddr(outer4), outer6: netip.MustParseAddr(outer6),
		inner4: netip.MustParseAddr(inner4), inner6: netip.MustParseAddr(inner6),
	}
	ns.MustIP(t, "addr", "add", inner4+"/32", "dev", "lo")
	ns.MustIP(t, "-6", "addr", "add", inner6+"/128", "dev", "lo", "nodad")
	d, err := New(Config{Workers: 2}, g.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel I/O as daemon.openIO makes it: TUN, router, sockets.
	var io IO
	err = ns.Do(func() error {
		dev, err := tun.Create(tun.Config{Name: tunName})
		if err != nil {
			return err
		}
		io.TUN = dev
		if g.router, err = routing.New(routing.Config{LinkIndex: dev.Index(), LinkName: dev.Name(), Table: 0xe5d3}); err != nil {
			dev.Close()
			return err
		}
		socks, err := conn.OpenSockets(conn.SocketConfig{Mark: routing.DefaultMark})
		if err != nil {
			g.router.Close()
			dev.Close()
			return err
		}
		io.Bind, io.PathMTU = socks, g.router.PathMTU
		if err := d.Start(io); err != nil {
			g.router.Close()
			dev.Close()
			socks.Close()
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	g.d = d
	t.Cleanup(func() {
		if err := g.router.Close(); err != nil {
			t.Errorf("router Close: %v", err)
		}
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return g
}

// protect adds an outbound protect policy (reqid 1) and its route.
func (g *gateway) protect(t *testing.T, src, dst string) {
	t.Helper()
	p, err := g.db.AddPolicy(sa.Policy{
		Selector: sa.Selector{Src: netip.MustParsePrefix(src), Dst: netip.MustParsePrefix(dst)},
		Dir:      sa.DirOut, Action: sa.ActionProtect, ReqID: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.router.AddRoute(p.Src, p.Dst, routing.Tunnel); err != nil {
		t.Fatal(err)
	}
	g.policies = append(g.policies, p)
}

// states replaces g's states by an outbound one to peer and an inbound one
// from it, for the given outer family and encapsulation.
func (g *gateway) states(t *testing.T, peer *gateway, outSPI, inSPI uint32, v6, udp bool) {
	t.Helper()
	g.db.FlushSAs()
	suite, err := crypto.ParseSuite("aes128gcm16")
	if err != nil {
		t.Fatal(err)
	}
	src, dst := g.outer4, peer.outer4
	if v6 {
		src, dst = g.outer6, peer.outer6
	}
	var port uint16
	if udp {
		port = conn.DefaultEncapPort
	}
	for _, c := range []sa.Config{
		{SPI: outSPI, Dir: sa.DirOut, Src: src, Dst: dst, EncKey: testKey(20, byte(outSPI>>8)^byte(outSPI))},
		{SPI: inSPI, Dir: sa.DirIn, Src: dst, Dst: src, EncKey: testKey(20, byte(inSPI>>8)^byte(inSPI)), ReplayWindow: 64,
			Selectors: []sa.Selector{
				{Src: netip.PrefixFrom(peer.inner4, 24).Masked(), Dst: netip.PrefixFrom(g.inner4, 24).Masked()},
				{Src: netip.PrefixFrom(peer.inner6, 48).Masked(), Dst: netip.PrefixFrom(g.inner6, 48).Masked()},
			}},
	} {
		c.Suite, c.ReqID, c.EncapSrcPort, c.EncapDstPort = suite, 1, port, port
		if _, err := g.db.AddSA(c); err != nil {
			t.Fatal(err)
		}
	}
}

// ping sends an ICMP echo request from g's inner address of dst's family
// to dst and waits up to 5 s for the reply.
func (g *gateway) ping(t *testing.T, dst netip.Addr, seq int) error {
	t.Helper()
	network, src := "ip4:icmp", g.inner4
	var typ icmp.Type = ipv4.ICMPTypeEcho
	proto := 1
	if dst.Is6() {
		network, src, typ, proto = "ip6:ipv6-icmp", g.inner6, ipv6.ICMPTypeEchoRequest, 58
	}
	var c *icmp.PacketConn
	if err := g.ns.Do(func() (err error) { c, err = icmp.ListenPacket(network, src.String()); return err }); err != nil {
		return err
	}
	defer c.Close()
	id := os.Getpid() & 0xffff
	msg, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("espd netns test")}}).Marshal(nil)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(msg, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		return fmt.Errorf("send echo: %w", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	for range 50 {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("no echo reply from %v: %w", dst, err)
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil {
			continue
		}
		if e, ok := m.Body.(*icmp.Echo); ok && (m.Type == ipv4.ICMPTypeEchoReply || m.Type == ipv6.ICMPTypeEchoReply) &&
			e.ID == id && e.Seq == seq && from.String() == dst.String() {
			return nil
		}
	}
	return fmt.Errorf("no matching echo reply from %v", dst)
}

// countersAddUp reports whether st's system-call counters agree with its
// packet counters: at least one call each way, and no more calls than
// datagrams, nor datagrams than packets. A datagram is counted when the
// call returns it and its packet when its batch is done, so the two agree
// only once no batch is in flight: tests wait for it.
func countersAddUp(st Stats) bool {
	return st.TUNReads != 0 && st.TUNReads <= st.TUNRxPackets && st.TUNWrites != 0 && st.TUNWrites <= st.TUNTxPackets &&
		st.RecvCalls != 0 && st.RecvCalls <= st.RecvDatagrams && st.RecvDatagrams <= st.RxPackets &&
		st.SendCalls != 0 && st.SendCalls <= st.SendMessages && st.SendMessages <= st.TxPackets
}

// udpIn returns the namespace's count of UDP datagrams delivered to
// sockets (Udp InDatagrams, or Udp6InDatagrams).
func (g *gateway) udpIn(t *testing.T, v6 bool) uint64 {
	t.Helper()
	var b []byte
	file := "/proc/thread-self/net/snmp"
	if v6 {
		file = "/proc/thread-self/net/snmp6"
	}
	if err := g.ns.Do(func() (err error) { b, err = os.ReadFile(file); return err }); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		f := strings.Fields(l)
		if v6 && len(f) == 2 && f[0] == "Udp6InDatagrams" {
			n, _ := strconv.ParseUint(f[1], 10, 64)
			return n
		}
		if !v6 && len(f) > 1 && f[0] == "Udp:" && i+1 < len(lines) && f[1] == "InDatagrams" {
			v := strings.Fields(lines[i+1])
			n, _ := strconv.ParseUint(v[1], 10, 64)
			return n
		}
	}
	t.Fatalf("no UDP counter in %s", file)
	return 0
}

// TestTwoNamespaces runs two Devices in two namespaces joined by a veth
// pair, with manual aes128gcm16 states both ways, and pings between their
// protected addresses (IPv4 and IPv6 inside) through the TUNs, over raw
// ESP and ESP-in-UDP with IPv4 and IPv6 outside. A's policies cover the
// whole test range, B's outer address included: its own ESP stays out of
// the TUN because it is from no policy's source (and marked, which would
// take it past the rules if it were).
func TestTwoNamespaces(t *testing.T) {
	nsA, nsB := testbed.NewNodeT(t, "dpA"), testbed.NewNodeT(t, "dpB")
	testbed.VethT(t, nsA, "va", nsB, "vb")
	nsA.MustIP(t, "addr", "add", "198.18.1.1/24", "dev", "va")
	nsB.MustIP(t, "addr", "add", "198.18.1.2/24", "dev", "vb")
	nsA.MustIP(t, "-6", "addr", "add", "2001:db8:1::1/64", "dev", "va", "nodad")
	nsB.MustIP(t, "-6", "addr", "add", "2001:db8:1::2/64", "dev", "vb", "nodad")

	a := newGateway(t, nsA, "espa0", "198.18.1.1", "2001:db8:1::1", "198.19.10.1", "2001:db8:10::1")
	b := newGateway(t, nsB, "espb0", "198.18.1.2", "2001:db8:1::2", "198.19.20.1", "2001:db8:20::1")
	a.protect(t, "198.19.10.0/24", "198.18.0.0/15")
	a.protect(t, "2001:db8:10::/48", "2001:db8::/32")
	b.protect(t, "198.19.20.0/24", "198.19.10.0/24")
	b.protect(t, "2001:db8:20::/48", "2001:db8:10::/48")

	seq := 0
	for i, tc := range []struct {
		name    string
		v6, udp bool
	}{
		{"raw ESP over IPv4", false, false},
		{"ESP-in-UDP over IPv4", false, true},
		{"raw ESP over IPv6", true, false},
		{"ESP-in-UDP over IPv6", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			udpBefore := b.udpIn(t, tc.v6)
			ab, ba := uint32(0x1000+i), uint32(0x2000+i)
			a.states(t, b, ab, ba, tc.v6, tc.udp)
			b.states(t, a, ba, ab, tc.v6, tc.udp)
			for _, p := range []struct {
				from *gateway
				to   netip.Addr
			}{
				{a, b.inner4}, {a, b.inner6}, {b, a.inner4}, {b, a.inner6},
			} {
				seq++
				if err := p.from.ping(t, p.to, seq); err != nil {
					t.Errorf("ping %v: %v\nA: %+v\nB: %+v", p.to, err, a.d.Stats(), b.d.Stats())
				}
			}
			// The ESP reached B over UDP exactly when it should have.
			if d := b.udpIn(t, tc.v6) - udpBefore; tc.udp != (d >= 4) || (!tc.udp && d != 0) {
				t.Errorf("B received %d UDP datagrams", d)
			}
			for _, g := range []*gateway{a, b} {
				for _, s := range g.db.SAs() {
					// Each state carried two requests or two replies.
					if st := s.Stats(); st.Packets != 4 {
						t.Errorf("%v: %d packets, want 4 (drops %v)", s, st.Packets, st.Drops)
					}
				}
			}
		})
	}
	for _, g := range []*gateway{a, b} {
		// The reply that let the test go on was delivered inside the TUN
		// write, before the stages added their batches to the data path's
		// counters: wait until every batch in flight is in.
		st := g.d.Stats()
		for deadline := time.Now().Add(30 * time.Second); !countersAddUp(st); st = g.d.Stats() {
			if time.Now().After(deadline) {
				t.Errorf("system-call counters do not add up: %+v", st)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if drops := g.db.Stats().Drops; st.InvalidSPI != 0 || totalDrops(drops) != 0 || st.SendErrors != 0 {
			t.Errorf("unexpected drops: %+v, states' drops %v", st, drops)
		}
	}
	// Removing the policies' routes leaves the table empty.
	for _, g := range []*gateway{a, b} {
		for _, p := range g.policies {
			if err := g.router.RemoveRoute(p.Src, p.Dst, routing.Tunnel); err != nil {
				t.Error(err)
			}
		}
		if out := g.ns.MustIP(t, "route", "show", "table", "all", "proto", "229"); out != "" {
			t.Errorf("routes left in %s: %s", g.ns.Name, out)
		}
	}
}
