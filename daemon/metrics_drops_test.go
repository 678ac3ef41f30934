package daemon

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	ippacket "github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
	"golang.org/x/sys/unix"
)

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
	before, _ := hub.Stats()
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
	after, _ := hub.Stats()
	if after.Received != before.Received+1 || after.Sent != before.Sent+1 || after.SendErrors != before.SendErrors+1 || after.Refused != before.Refused+1 {
		t.Errorf("IKE hand-off counters %+v after %+v: want one more received, sent, send error and refusal", after, before)
	}
}
