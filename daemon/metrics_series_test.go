package daemon

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/esp"
	ippacket "github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// movedElsewhere lists the series TestMetricsSeries cannot drive through a
// running daemon, each with the code that increments it and the test that
// proves it moves there. The test checks that the file holds the test
// function and names the counter.
var movedElsewhere = map[string]struct {
	counter   string // the code that increments the series
	file      string // the proving test's file, from the module root
	test      string // the proving test
	reference string // what that test reads: the counter's field
}{
	"espd_dataplane_icmp_sent_total": {"dataplane/pmtu.go icmpSender.tooBig, for a packet too big for the path",
		"dataplane/pmtu_test.go", "TestPathMTU", "ICMPSent"},
	"espd_dataplane_icmp_limited_total": {"dataplane/pmtu.go icmpSender.tooBig, when the rate limit holds the error back",
		"dataplane/pmtu_test.go", "TestICMPRateLimit", "ICMPLimited"},
	"espd_dataplane_fragments_total": {"dataplane/outbound.go Device.sendBatch, for an outer packet split in fragments",
		"dataplane/pmtu_test.go", "TestPathMTU", "Fragments"},
	"espd_dataplane_queue_drops_total": {"dataplane/outbound.go classifyOut and inbound.go classifyIn, when the workers' queue is full",
		"dataplane/pipeline_test.go", "TestQueueFullDropsWithoutBlocking", "QueueDrops"},
	"espd_dataplane_handed_off_total": {"dataplane/outbound.go classifyOut and inbound.go classifyIn, for a batch handed to the workers",
		"dataplane/pipeline_test.go", "TestOrderAcrossHandOff", "HandedOff"},
	"espd_dataplane_read_errors_total": {"dataplane/outbound.go readTUN and inbound.go readOuter, when a TUN or outer socket read fails",
		"dataplane/pipeline_test.go", "TestReadErrorsCounted", "ReadErrors"},
	"espd_dataplane_tun_super_reads_total": {"tun's Read of a TSO/USO super-packet (tun.Stats.SuperReads, copied by dataplane.Device.Stats)",
		"tun/offload_test.go", "TestCoalesceAndSplit", "SuperReads"},
	"espd_dataplane_tun_queue_drops_total": {"the kernel, when the TUN's transmit queue is full (tun.Stats.QueueDrops, the interface's tx_dropped, copied by dataplane.Device.Stats)",
		"tun/queue_test.go", "TestQueueDrops", "QueueDrops"},
	"espd_dataplane_tun_uring_enters_total": {"tun's Write of two or more writes through io_uring (tun.Stats.URingEnters, copied by dataplane.Device.Stats)",
		"tun/uring_internal_test.go", "TestURingEnterRefused", "URingEnters"},
	"espd_dataplane_tun_super_writes_total": {"tun's Write of a coalesced super-packet (tun.Stats.SuperWrites, copied by dataplane.Device.Stats)",
		"tun/offload_test.go", "TestCoalesceAndSplit", "SuperWrites"},
	"espd_dataplane_no_interface_total": {"dataplane/inbound.go classifyIn, for a packet of a state whose if_id no route-based interface has",
		"dataplane/interfaces_test.go", "TestInterfaces", "NoInterface"},
	"espd_ike_read_errors_total": {"conn/ike_linux.go ikeRelay.read, when a read of an IKE-port socket fails",
		"conn/ike_linux_test.go", "TestIKEReadErrorsCounted", "ReadErrors"},
}

// unproven lists the series that nothing in the tests moves yet, with why;
// TestMetricsSeries logs them. Keep it empty: a series belongs here only
// until a test causes what it counts.
var unproven = map[string]string{}

// series is a scrape: the value of each series, by name and sorted labels.
type series map[string]float64

// TestMetricsSeries scrapes a running daemon, causes every event it counts
// (traffic through its TUN and sockets in its namespace, control calls,
// drops on its states), and scrapes again: every series must have moved,
// or be in movedElsewhere (or, logged, in unproven). A series added
// without anything that moves it fails here.
func TestMetricsSeries(t *testing.T) {
	d, client, ns := startMetricsDaemon(t, Options{
		// An outer MTU below the TUN's: a packet can be too big for a
		// state (stateDrops).
		Dataplane:    dataplane.Config{Keepalive: 100 * time.Millisecond, OuterMTU: stateDropsOuterMTU},
		MetricsPerSA: 1,
		IKEHandoff:   true,
	})
	scrapeHTTP := func(t *testing.T) string { return get(t, client) }
	before := scrapeBody(t, scrapeHTTP)

	// A peer daemon in its own namespace, across a veth pair; 198.18.5.0/24
	// stays unreachable.
	local, peer := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	peerNS := testbed.NewNodeT(t, "peer")
	testbed.VethT(t, ns, "va", peerNS, "vb")
	ns.MustIP(t, "addr", "add", "198.18.0.1/24", "dev", "va")
	peerNS.MustIP(t, "addr", "add", "198.18.0.2/24", "dev", "vb")
	pd := startPeer(t, peerNS)

	db := d.DB()
	sub := db.Subscribe(1) // never read: its second event is dropped
	t.Cleanup(sub.Close)

	policies := []sa.Policy{
		// UDP to 198.19.1.0/24 is protected (reqid 1), other protocols
		// reach the TUN (its route is per destination) without a policy.
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.1.0/24"), Proto: 17}, Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: 1, Priority: 100},
		// UDP to port 7 bypasses, before the protect policy.
		{Selector: sa.Selector{Proto: 17, DstPorts: sa.PortRange{Lo: 7, Hi: 7}}, Dir: sa.DirOut, Action: sa.ActionBypass, Priority: 10},
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.2.0/24")}, Dir: sa.DirOut, Action: sa.ActionDrop, Priority: 100},
		// Protected by a state whose peer is unreachable.
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.4.0/24")}, Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: 2, Priority: 100},
	}
	for _, p := range policies {
		if _, err := d.AddPolicy(p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.AllocSPI(0x7000, 0x7fff); err != nil {
		t.Fatal(err)
	}

	dp := func() dataplane.Stats { return d.dp.Stats() }
	wait := func(what string, ok func(dataplane.Stats) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok(dp()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5 s: %+v", what, dp())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	send := func(to string, payload []byte) {
		t.Helper()
		if _, err := ns.SendUDP(context.Background(), netip.MustParseAddrPort(to), testbed.UDPSendOptions{Payload: payload}); err != nil {
			t.Fatalf("send to %s: %v", to, err)
		}
	}
	payload := []byte("espd metrics series test")

	// No state yet: an acquire, then one the rate limit holds back, then
	// one for another destination, which the full subscriber loses.
	send("198.19.1.5:9", payload)
	wait("no SA", func(s dataplane.Stats) bool { return s.NoSA == 1 })
	send("198.19.1.5:9", payload)
	wait("no SA again", func(s dataplane.Stats) bool { return s.NoSA == 2 })
	send("198.19.1.6:9", payload)
	wait("no SA for another destination", func(s dataplane.Stats) bool { return s.NoSA == 3 })
	if g := db.Stats(); g.Acquires != 2 || g.AcquiresSuppressed != 1 || g.EventsDropped != 1 {
		t.Errorf("acquires %d, suppressed %d, events dropped %d; want 2, 1, 1", g.Acquires, g.AcquiresSuppressed, g.EventsDropped)
	}
	send("198.19.1.5:7", payload)
	wait("bypass in the TUN", func(s dataplane.Stats) bool { return s.BypassInTUN == 1 })
	send("198.19.2.5:9", payload)
	wait("drop policy", func(s dataplane.Stats) bool { return s.PolicyDrops == 1 })
	ns.Do(func() error { // a TCP SYN: no policy matches it
		c, err := net.DialTimeout("tcp", "198.19.1.5:80", 50*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return nil
	})
	wait("no policy", func(s dataplane.Stats) bool { return s.NoPolicy >= 1 })

	// States with the peer both ways (ESP-in-UDP), and one whose peer
	// has no route. The peer protects UDP to 198.19.10.0/24 towards us.
	suite, err := crypto.ParseSuite("aes128gcm16")
	if err != nil {
		t.Fatal(err)
	}
	state := func(spi uint32, dir sa.Direction, reqid uint32, src, dst netip.Addr, encap uint16) sa.Config {
		c := sa.Config{SPI: spi, Dir: dir, ReqID: reqid, Src: src, Dst: dst, Suite: suite,
			EncapSrcPort: encap, EncapDstPort: encap, EncKey: make([]byte, suite.EncKeyLen())}
		for i := range c.EncKey {
			c.EncKey[i] = byte(i)
		}
		c.EncKey[0], c.EncKey[1] = byte(spi>>8), byte(spi)
		if dir == sa.DirIn {
			c.ReplayWindow = 64
		}
		return c
	}
	for _, c := range []sa.Config{
		state(0x300, sa.DirOut, 1, local, peer, 4500),
		state(0x400, sa.DirIn, 1, peer, local, 4500),
		state(0x301, sa.DirOut, 2, local, netip.MustParseAddr("198.18.5.1"), 0),
	} {
		if err := d.AddSA(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []sa.Config{
		state(0x300, sa.DirIn, 1, local, peer, 4500),
		state(0x400, sa.DirOut, 1, peer, local, 4500),
	} {
		if err := pd.AddSA(c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pd.AddPolicy(sa.Policy{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.10.0/24"), Proto: 17},
		Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: 1}); err != nil {
		t.Fatal(err)
	}
	send("198.19.1.5:9", payload)
	wait("an outer packet sent", func(s dataplane.Stats) bool { return s.TxPackets >= 1 })
	sendFromPeer := func() {
		t.Helper()
		if _, err := peerNS.SendUDP(context.Background(), netip.MustParseAddrPort("198.19.10.5:9"), testbed.UDPSendOptions{Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	sendFromPeer()
	wait("the peer's packet in the TUN", func(s dataplane.Stats) bool { return s.TUNTxPackets >= 1 })
	send("198.19.4.5:9", payload)
	wait("a send error", func(s dataplane.Stats) bool { return s.SendErrors >= 1 })
	wait("keepalives", func(s dataplane.Stats) bool { return s.KeepalivesTx >= 1 && s.KeepalivesRx >= 1 })

	// Straight to the encapsulation port: IKE (no IKE daemon is
	// registered for the hand-off yet: undelivered), an unknown SPI, and a
	// datagram too short for ESP.
	natt := netip.AddrPortFrom(local, 4500).String()
	send(natt, append(make([]byte, 4), make([]byte, 28)...))
	send(natt, append([]byte{0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1}, payload...))
	send(natt, []byte{1, 2, 3})
	wait("IKE, invalid SPI, malformed", func(s dataplane.Stats) bool {
		return s.IKE == 1 && s.InvalidSPI == 1 && s.Malformed == 1
	})
	handOff(t, d, ns, local, peer)

	// Every reason a state drops for, each caused by what it counts.
	stateDrops(t, d, ns, peerNS, local, peer, suite)

	// The TUN down: the peer's next packet cannot be written to it.
	ns.MustIP(t, "link", "set", tun.DefaultName, "down")
	sendFromPeer()
	wait("a failed TUN write", func(s dataplane.Stats) bool { return s.TUNWriteErrors >= 1 })

	after := scrapeBody(t, scrapeHTTP)
	// What the acquire rate limit held back is not exported: it is the
	// difference of two series.
	if held, want := after["espd_dataplane_no_sa_total{}"]-after["espd_acquires_total{}"], db.Stats().AcquiresSuppressed; held != float64(want) {
		t.Errorf("espd_dataplane_no_sa_total - espd_acquires_total = %v, want the %d acquires the rate limit held back", held, want)
	}
	var still []string
	for key, v := range after {
		name, _, _ := strings.Cut(key, "{")
		if _, ok := movedElsewhere[name]; ok {
			continue
		}
		if why, ok := unproven[name]; ok {
			t.Logf("not proven to move: %s: %s", name, why)
			continue
		}
		if old, ok := before[key]; (ok && old == v) || (!ok && v == 0) {
			still = append(still, fmt.Sprintf("%s = %v", key, v))
		}
	}
	slices.Sort(still)
	for _, s := range still {
		t.Errorf("did not move: %s (cause it here, or list it in movedElsewhere)", s)
	}
	for key := range before {
		if _, ok := after[key]; !ok && !strings.HasPrefix(key, "espd_sa_") {
			t.Errorf("series %s went away", key)
		}
	}
	exported := map[string]bool{}
	for key := range after {
		name, _, _ := strings.Cut(key, "{")
		exported[name] = true
	}
	checkMovedElsewhere(t, exported)
	t.Logf("%d series; data path: %+v", len(after), dp())
}

// stateDropsOuterMTU is TestMetricsSeries's outer MTU: a state's inner MTU
// under it is below the TUN's MTU.
const stateDropsOuterMTU = 1280

// stateDrops makes the states of d, which runs in ns at local next to peer
// (in peerNS) with the outer MTU stateDropsOuterMTU, drop a packet for
// every sa.DropReason, each for what that reason counts, and checks that
// each is counted under its reason.
//
// Inbound, a state added here gets ESP-in-UDP packets from peerNS built
// as a peer would, with esp.Encapsulate, or sealed by hand with the
// state's crypto transform where the plaintext is the point (padding,
// next header, inner packet, dummy). Outbound, a packet with DF too big
// for a state's inner MTU (too-big), and a state added with oseq at its
// last number sent two datagrams in one UDP_SEGMENT super-packet: the TUN
// hands them over in one read, and the second cannot be numbered
// (sequence).
func stateDrops(t *testing.T, d *Daemon, ns, peerNS *testbed.Node, local, peer netip.Addr, suite crypto.Suite) {
	t.Helper()
	db := d.DB()
	const (
		inSPI, seqSPI = 0x500, 0x302
		peerPort      = 4600 // the inbound state's peer port: no mapping event
	)
	key := func(spi uint32) []byte {
		k := make([]byte, suite.EncKeyLen())
		for i := range k {
			k[i] = byte(i) ^ 0x5a
		}
		k[0], k[1] = byte(spi>>8), byte(spi)
		return k
	}
	in := sa.Config{SPI: inSPI, Dir: sa.DirIn, ReqID: 5, Src: peer, Dst: local, Suite: suite,
		EncapSrcPort: peerPort, EncapDstPort: conn.DefaultEncapPort, EncKey: key(inSPI), ReplayWindow: 64,
		ECN:       true,
		Selectors: []sa.Selector{{Dst: netip.MustParsePrefix("198.19.20.0/24")}}}
	if err := d.AddSA(in); err != nil {
		t.Fatal(err)
	}
	// The peer's side of the inbound state.
	tr, err := crypto.New(suite, key(inSPI), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Zero()
	enc := &esp.Encapsulator{SPI: inSPI, Transform: tr,
		Outer: esp.Outer{Src: peer, Dst: local, SrcPort: peerPort, DstPort: conn.DefaultEncapPort}}
	inner := func(dst string) []byte {
		return innerUDP(netip.MustParseAddr("198.19.10.5"), netip.MustParseAddr(dst), []byte("espd drop reasons"))
	}
	sealed := func(pkt []byte, seq uint64) []byte {
		t.Helper()
		const room = 128
		buf := make([]byte, room+len(pkt)+room)
		copy(buf[room:], pkt)
		p, err := enc.Encapsulate(buf, room, len(pkt), seq)
		if err != nil {
			t.Fatal(err)
		}
		return buf[p.ESP:p.End]
	}
	// byHand seals payload, pad, the Pad Length and nh.
	byHand := func(payload, pad []byte, nh uint8, seq uint32) []byte {
		pt := append(append(slices.Clone(payload), pad...), byte(len(pad)), nh)
		pkt := make([]byte, esp.HeaderLen+tr.IVSize()+len(pt)+tr.ICVSize())
		binary.BigEndian.PutUint32(pkt[0:4], inSPI)
		binary.BigEndian.PutUint32(pkt[4:8], seq)
		copy(pkt[esp.HeaderLen+tr.IVSize():], pt)
		tr.Seal(pkt, uint64(seq))
		return pkt
	}
	// pad returns RFC 4303 padding 1, 2, 3, ... for a payload of n bytes,
	// at least one byte.
	pad := func(n int) []byte {
		bs := tr.BlockSize()
		p := make([]byte, (bs-(n+2)%bs)%bs)
		if len(p) == 0 {
			p = make([]byte, bs)
		}
		for i := range p {
			p[i] = byte(i + 1)
		}
		return p
	}
	sendESP := func(tos int, pkts ...[]byte) {
		t.Helper()
		err := peerNS.Do(func() error {
			c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer, peerPort)),
				net.UDPAddrFromAddrPort(netip.AddrPortFrom(local, conn.DefaultEncapPort)))
			if err != nil {
				return err
			}
			defer c.Close()
			if err := setsockopt(c, unix.IPPROTO_IP, unix.IP_TOS, tos); err != nil {
				return err
			}
			for _, p := range pkts {
				if _, err := c.Write(p); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("ESP from the peer: %v", err)
		}
	}

	ok := inner("198.19.20.5")
	icv := sealed(ok, 2)
	icv[len(icv)-1] ^= 1
	badPad := pad(len(ok))
	badPad[len(badPad)-1] ^= 0x80
	garbage := bytes.Repeat([]byte{0xff}, 24)
	sendESP(0,
		sealed(ok, 1), sealed(ok, 1), // the same packet twice
		icv,
		append(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, inSPI), 3), 1, 2, 3, 4), // too short for IV and ICV
		byHand(ok, badPad, esp.NextHeaderIPv4, 4),
		byHand(ok, pad(len(ok)), ippacket.ProtoTCP, 5),            // neither IPv4, IPv6 nor 59
		byHand(garbage, pad(len(garbage)), esp.NextHeaderIPv4, 6), // not an IPv4 packet
		byHand([]byte{0, 0}, pad(2), esp.NextHeaderDummy, 7),      // TFC dummy
		sealed(inner("198.19.21.5"), 9),                           // outside the selectors
	)
	sendESP(int(ippacket.ECNCE), sealed(ok, 8)) // CE outside, Not-ECT inside

	// Outbound: a packet with DF too big for the inner MTU of state 0x300
	// (reqid 1, to 198.19.1.0/24).
	err = ns.Do(func() error {
		c, err := net.Dial("udp4", "198.19.1.5:9")
		if err != nil {
			return err
		}
		defer c.Close()
		if err := setsockopt(c.(*net.UDPConn), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO); err != nil {
			return err
		}
		_, err = c.Write(make([]byte, stateDropsOuterMTU))
		return err
	})
	if err != nil {
		t.Fatalf("a packet too big for the path: %v", err)
	}

	// Outbound: a state with one sequence number left.
	if _, err := d.AddPolicy(sa.Policy{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.6.0/24"), Proto: 17},
		Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: 6, Priority: 100}); err != nil {
		t.Fatal(err)
	}
	if err := d.AddSA(sa.Config{SPI: seqSPI, Dir: sa.DirOut, ReqID: 6, Src: local, Dst: peer, Suite: suite,
		EncapSrcPort: conn.DefaultEncapPort, EncapDstPort: conn.DefaultEncapPort, EncKey: key(seqSPI),
		OSeq: 1<<32 - 2}); err != nil {
		t.Fatal(err)
	}
	var last *sa.SA
	for _, s := range db.SAs() {
		if s.SPI() == seqSPI {
			last = s
		}
	}
	err = ns.Do(func() error {
		c, err := net.Dial("udp4", "198.19.6.5:9")
		if err != nil {
			return err
		}
		defer c.Close()
		if err := setsockopt(c.(*net.UDPConn), unix.IPPROTO_UDP, unix.UDP_SEGMENT, 100); err != nil {
			return err
		}
		_, err = c.Write(make([]byte, 200))
		return err
	})
	if err != nil {
		t.Fatalf("two datagrams in one super-packet: %v", err)
	}

	inbound := db.LookupInbound(inSPI)
	out := db.OutboundSA(1)
	want := map[*sa.SA][sa.NumDropReasons]uint64{
		inbound: {sa.DropReplay: 1, sa.DropIntegrity: 1, sa.DropMalformed: 1, sa.DropPadding: 1,
			sa.DropNextHeader: 1, sa.DropInner: 1, sa.DropDummy: 1, sa.DropECN: 1, sa.DropSelector: 1},
		out:  {sa.DropTooBig: 1},
		last: {sa.DropSequence: 1},
	}
	covered := map[sa.DropReason]bool{}
	for s, w := range want {
		if s == nil {
			t.Fatal("a state of stateDrops is missing")
		}
		deadline := time.Now().Add(10 * time.Second)
		for s.Stats().Drops != w && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := s.Stats().Drops; got != w {
			t.Errorf("state spi 0x%x drops %v, want %v", s.SPI(), got, w)
			if s == last {
				t.Logf("the TUN's super-packet reads: %d (the two datagrams must reach espd in one read: USO)", d.dp.Stats().TUNSuperReads)
			}
		}
		for r, n := range w {
			if n > 0 {
				covered[sa.DropReason(r)] = true
			}
		}
	}
	for r := range sa.NumDropReasons {
		if !covered[r] {
			t.Errorf("stateDrops causes no %v drop", r)
		}
	}
}

// innerUDP returns an IPv4 UDP packet from src to dst, Not-ECT, port 9 to
// 9, carrying payload.
func innerUDP(src, dst netip.Addr, payload []byte) []byte {
	p := make([]byte, ippacket.IPv4HeaderLen+ippacket.UDPHeaderLen+len(payload))
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:4], uint16(len(p)))
	p[8], p[9] = 64, ippacket.ProtoUDP
	copy(p[12:16], src.AsSlice())
	copy(p[16:20], dst.AsSlice())
	binary.BigEndian.PutUint16(p[10:12], ippacket.Checksum(p[:ippacket.IPv4HeaderLen], 0))
	u := p[ippacket.IPv4HeaderLen:]
	binary.BigEndian.PutUint16(u[0:2], 9)
	binary.BigEndian.PutUint16(u[2:4], 9)
	binary.BigEndian.PutUint16(u[4:6], uint16(len(u)))
	copy(u[ippacket.UDPHeaderLen:], payload)
	return p
}

// setsockopt sets an integer socket option of c.
func setsockopt(c syscall.Conn, level, opt, value int) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, opt, value) }); err != nil {
		return err
	}
	return serr
}

// handOff moves the IKE hand-off's counters of d, which runs in ns at
// local next to peer: an IKE daemon registers, receives a datagram that
// arrives on the IKE port, and sends one to the peer (sent), one to an
// address without a route (a send error) and one from a port that is not
// IKE's (refused).
func handOff(t *testing.T, d *Daemon, ns *testbed.Node, local, peer netip.Addr) {
	t.Helper()
	// An IKE header: SPIs, next payload, version 2.0, IKE_SA_INIT, flags,
	// message ID, length.
	ike := []byte{1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0, 33, 0x20, 34, 0x08, 0, 0, 0, 0, 0, 0, 0, 28}
	hub := d.ike.Load()
	if hub == nil {
		t.Fatal("the IKE hand-off is not running")
	}
	before := hub.ike.IKEStats()
	sess, err := d.RegisterIKE(8)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if _, err := ns.SendUDP(context.Background(), netip.AddrPortFrom(local, conn.DefaultIKEPort), testbed.UDPSendOptions{Payload: ike}); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-sess.Packets():
		if !bytes.Equal(p.Data, ike) {
			t.Fatalf("the IKE daemon got %x, want %x", p.Data, ike)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no IKE datagram handed over within 10 s")
	}
	from := netip.AddrPortFrom(local, conn.DefaultIKEPort)
	if err := sess.Send(conn.IKEPacket{Src: from, Dst: netip.AddrPortFrom(peer, conn.DefaultIKEPort), Data: ike}); err != nil {
		t.Errorf("IKE to the peer: %v", err)
	}
	if err := sess.Send(conn.IKEPacket{Src: from, Dst: netip.MustParseAddrPort("198.18.5.1:500"), Data: ike}); err == nil {
		t.Error("IKE to an address without a route was sent")
	}
	if err := sess.Send(conn.IKEPacket{Src: netip.AddrPortFrom(local, 4501), Dst: netip.AddrPortFrom(peer, conn.DefaultIKEPort), Data: ike}); err == nil {
		t.Error("IKE from port 4501 was not refused")
	}
	after := hub.ike.IKEStats()
	if after.Received != before.Received+1 || after.Sent != before.Sent+1 || after.SendErrors != before.SendErrors+1 || after.Refused != before.Refused+1 {
		t.Errorf("IKE hand-off counters %+v after %+v: want one more received, sent, send error and refusal", after, before)
	}
}

// scrapeBody scrapes with get and returns the series.
func scrapeBody(t *testing.T, get func(*testing.T) string) series {
	t.Helper()
	body := get(t)
	checkExposition(t, body)
	fams, err := parseText(body)
	if err != nil {
		t.Fatal(err)
	}
	return familySeries(t, fams)
}

// familySeries flattens parsed families into series.
func familySeries(t *testing.T, fams map[string]*dto.MetricFamily) series {
	t.Helper()
	out := series{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			labels := make([]string, 0, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			key := name + "{" + strings.Join(labels, ",") + "}"
			var v float64
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			default:
				t.Errorf("%s: type %v", key, f.GetType())
			}
			if _, dup := out[key]; dup {
				t.Errorf("duplicate series %s", key)
			}
			out[key] = v
		}
	}
	return out
}

// checkMovedElsewhere checks movedElsewhere against what is exported and
// against the tests it names.
func checkMovedElsewhere(t *testing.T, exported map[string]bool) {
	t.Helper()
	for name := range unproven {
		if !exported[name] {
			t.Errorf("unproven lists %s, which is not exported", name)
		}
		if _, ok := movedElsewhere[name]; ok {
			t.Errorf("%s is both in unproven and in movedElsewhere", name)
		}
	}
	for name, e := range movedElsewhere {
		if !exported[name] {
			t.Errorf("movedElsewhere lists %s, which is not exported", name)
		}
		src, err := os.ReadFile(filepath.Join("..", e.file))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !strings.Contains(string(src), "func "+e.test+"(t *testing.T)") {
			t.Errorf("%s: %s has no %s", name, e.file, e.test)
		}
		if !strings.Contains(string(src), "."+e.reference) {
			t.Errorf("%s: %s does not read %s", name, e.file, e.reference)
		}
	}
}

// TestMetricsOneSeriesPerCounter gives every counter of dataplane.Stats a
// distinct value and checks that each exported espd_dataplane_* series
// carries exactly one of them, under its own name, and that no other
// series carries any. Every counter is exported and has its help text.
func TestMetricsOneSeriesPerCounter(t *testing.T) {
	var st dataplane.Stats
	v := reflect.ValueOf(&st).Elem()
	byValue := map[float64]string{}
	for i := range v.NumField() {
		val := uint64(1_000_000 + 1000*i)
		v.Field(i).SetUint(val)
		byValue[float64(val)] = v.Type().Field(i).Name
	}
	db, err := fillDB(3)
	if err != nil {
		t.Fatal(err)
	}
	body := scrape(t, newMetrics(db, func() dataplane.Stats { return st }, 0, nil))
	fams, err := parseText(body)
	if err != nil {
		t.Fatal(err)
	}
	got := familySeries(t, fams)
	seen := map[string]string{} // field -> series
	for key, val := range got {
		field, ok := byValue[val]
		name, _, _ := strings.Cut(key, "{")
		switch {
		case !ok && strings.HasPrefix(name, "espd_dataplane_"):
			t.Errorf("%s = %v: no dataplane.Stats counter has this value", key, val)
		case !ok:
		case name != "espd_dataplane_"+snake(field)+"_total":
			t.Errorf("%s carries dataplane.Stats.%s", key, field)
		case seen[field] != "":
			t.Errorf("dataplane.Stats.%s exported twice: %s and %s", field, seen[field], key)
		default:
			seen[field] = key
		}
	}
	for i := range v.NumField() {
		f := v.Type().Field(i).Name
		if _, help := dataplaneHelp[f]; !help {
			t.Errorf("dataplane.Stats.%s has no help text (dataplaneHelp)", f)
		}
		if seen[f] == "" {
			t.Errorf("dataplane.Stats.%s is not exported", f)
		}
	}
	for f := range dataplaneHelp {
		if _, ok := v.Type().FieldByName(f); !ok {
			t.Errorf("dataplaneHelp names %s, which dataplane.Stats does not have", f)
		}
	}
	for name, f := range fams {
		if h := f.GetHelp(); h == "" || !strings.HasSuffix(h, ".") {
			t.Errorf("%s: help %q is not a sentence", name, h)
		}
	}
}

// startPeer runs a daemon in ns, NAT-keepalives every
// 100 ms, until the test ends.
func startPeer(t *testing.T, ns *testbed.Node) *Daemon {
	t.Helper()
	d, err := New(Options{
		Dataplane:     dataplane.Config{Keepalive: 100 * time.Millisecond},
		Control:       control.ServerConfig{Path: filepath.Join(t.TempDir(), "peer.sock")},
		MetricsListen: metricsAddr, // in its own namespace
	})
	if err != nil {
		t.Fatal(err)
	}
	run := runIn(t, ns, d, nil)
	// Run has started the data path when the metrics endpoint listens.
	deadline := time.Now().Add(10 * time.Second)
	for ns.Do(func() error {
		c, err := net.DialTimeout("tcp", metricsAddr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}) != nil {
		if gone, err := run.exited(); gone {
			t.Fatalf("peer exited at start: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("peer not running within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return d
}

// fakeIKE is a conn.IKE that only has counters.
type fakeIKE struct{ st conn.IKEStats }

func (f *fakeIKE) StartIKE(uint16, conn.IKEHandler) error { return nil }
func (f *fakeIKE) StopIKE() error                         { return nil }
func (f *fakeIKE) DeliverIKE(conn.IKEPacket)              {}
func (f *fakeIKE) SendIKE(conn.IKEPacket) error           { return nil }
func (f *fakeIKE) IKEPorts() (ike, natt uint16)           { return 500, 4500 }
func (f *fakeIKE) IKEStats() conn.IKEStats                { return f.st }

// TestMetricsIKEOneSeriesPerCounter gives every counter of conn.IKEStats
// and the hub's undelivered count a distinct value and checks that each
// espd_ike_* series carries exactly one of them, under its own name, with
// its help text; without the hand-off there is no espd_ike_* series.
func TestMetricsIKEOneSeriesPerCounter(t *testing.T) {
	db, err := fillDB(1)
	if err != nil {
		t.Fatal(err)
	}
	noDP := func() dataplane.Stats { return dataplane.Stats{} }
	if body := scrape(t, newMetrics(db, noDP, 0, nil)); strings.Contains(body, "espd_ike_") {
		t.Errorf("espd_ike_* series without the hand-off:\n%s", body)
	}

	f := &fakeIKE{}
	v := reflect.ValueOf(&f.st).Elem()
	want := map[string]float64{}
	for i := range v.NumField() {
		val := uint64(2_000_000 + 1000*i)
		v.Field(i).SetUint(val)
		want["espd_ike_"+snake(v.Type().Field(i).Name)+"_total{}"] = float64(val)
		if _, ok := ikeHelp[v.Type().Field(i).Name]; !ok {
			t.Errorf("conn.IKEStats.%s has no help text (ikeHelp)", v.Type().Field(i).Name)
		}
	}
	for name := range ikeHelp {
		if _, ok := v.Type().FieldByName(name); !ok {
			t.Errorf("ikeHelp names %s, which conn.IKEStats does not have", name)
		}
	}
	hub := &ikeHub{ike: f}
	hub.undelivered.Store(1_999_999)
	want["espd_ike_undelivered_total{}"] = 1_999_999
	m := newMetrics(db, noDP, 0, nil)
	m.reg.MustRegister(&ikeCollector{hub: hub})
	fams, err := parseText(scrape(t, m))
	if err != nil {
		t.Fatal(err)
	}
	got := familySeries(t, fams)
	for key, val := range got {
		if strings.HasPrefix(key, "espd_ike_") {
			if w, ok := want[key]; !ok || w != val {
				t.Errorf("%s = %v, want %v", key, val, w)
			}
			delete(want, key)
		} else if val >= 1_999_999 && val < 3_000_000 {
			t.Errorf("%s = %v carries an IKE counter", key, val)
		}
	}
	for key := range want {
		t.Errorf("%s is not exported", key)
	}
	for name, f := range fams {
		if h := f.GetHelp(); strings.HasPrefix(name, "espd_ike_") && (h == "" || !strings.HasSuffix(h, ".")) {
			t.Errorf("%s: help %q is not a sentence", name, h)
		}
	}
}
