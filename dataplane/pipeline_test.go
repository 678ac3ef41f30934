package dataplane

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

var innerSrc4, innerSrc6 = netip.MustParseAddr("198.19.100.1"), netip.MustParseAddr("2001:db8:100::1")

// TestOrderUnderManyWorkers sends interleaved traffic of four tunnels (IPv4
// and IPv6 inside, raw and UDP-encapsulated, IPv4 and IPv6 outside)
// through a looped-back device with 8 workers, and checks that every
// state's sequence numbers leave in order without gaps and that every
// flow's packets come back out of the TUN in order.
func TestOrderUnderManyWorkers(t *testing.T) {
	checkOrder(t, Config{Workers: 8, QueueLen: 1024}, nil)
}

// TestOrderAcrossHandOff is TestOrderUnderManyWorkers with
// Config.HandOffBelow, whose threshold flips every five batches between a
// rate no cipher reaches and one every cipher beats, so that the readers
// go back and forth between running batches themselves and handing them
// to the workers while earlier batches are still on their way (half-way
// through each fast phase the test lets them drain, which is when the
// readers may take over again), and checks that Config.OnHandOff hears of
// each change once.
func TestOrderAcrossHandOff(t *testing.T) {
	var (
		mu    sync.Mutex
		calls []bool
	)
	onHandOff := func(h bool) {
		mu.Lock()
		calls = append(calls, h)
		mu.Unlock()
	}
	cfg := Config{Workers: 8, QueueLen: 1024, HandOffBelow: DefaultHandOffBelow, OnHandOff: onHandOff}
	var hd *Device
	st := checkOrder(t, cfg, func(h *harness, i, sent int) {
		hd = h.d
		above := int64(1 << 40)
		if i/5%2 == 0 {
			// Let what is in flight drain now and then, so that the
			// readers can go back to running batches themselves.
			above = 1
			if i%5 == 2 {
				waitFor(t, "the packets sent so far back in the TUN", func() bool { return h.tun.count.Load() >= uint64(sent) })
			}
		}
		h.d.outGauge.below.Store(above)
		h.d.inGauge.below.Store(above)
	})
	if st.CompletedBatches == 0 || st.HandedOff == 0 {
		t.Errorf("%d batches run to completion, %d handed off: want both", st.CompletedBatches, st.HandedOff)
	}
	// OnHandOff hears of the changes at most every
	// handOffReportInterval, so not of each: only changes, alternating,
	// the first a start, and in the end the state the gauges settled in
	// (the last batches ran slower than the threshold: handing off). The
	// run may end before the reporter's next look: wait for it.
	if !hd.outGauge.handing.Load() && !hd.inGauge.handing.Load() {
		t.Fatal("the gauges settled on running batches to completion after a phase slower than the threshold")
	}
	waitFor(t, "OnHandOff to report the state the gauges settled in", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) > 0 && calls[len(calls)-1]
	})
	mu.Lock()
	defer mu.Unlock()
	for i, h := range calls {
		if h != (i%2 == 0) {
			t.Fatalf("OnHandOff calls %v: want true, false, true, ... (only changes)", calls)
		}
	}
}

// TestHandOffReport: Config.OnHandOff is called from reportHandOff's
// goroutine with each change of the gauges it finds, at most every
// handOffReportInterval, and not at all for a change undone before it
// looks.
func TestHandOffReport(t *testing.T) {
	calls := make(chan bool, 8)
	d, err := New(Config{Workers: 2, HandOffBelow: 100, OnHandOff: func(h bool) { calls <- h }}, sa.NewDB(sa.Options{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	d.wg.Add(1)
	go d.reportHandOff()
	defer func() { close(d.stop); d.wg.Wait() }()
	expect := func(want bool, within time.Duration) {
		t.Helper()
		select {
		case h := <-calls:
			if h != want {
				t.Fatalf("OnHandOff(%v), want %v", h, want)
			}
		case <-time.After(within):
			t.Fatalf("no OnHandOff(%v) within %v", want, within)
		}
	}
	d.inGauge.handing.Store(true)
	d.handOffChanged()
	expect(true, 30*time.Second)
	start := time.Now()
	d.inGauge.handing.Store(false)
	d.handOffChanged()
	expect(false, 30*time.Second)
	if waited := time.Since(start); waited < handOffReportInterval/2 {
		t.Errorf("second report after %v: not rate-limited", waited)
	}
	// A change undone before the reporter looks is not reported.
	time.Sleep(handOffReportInterval + 100*time.Millisecond)
	d.outGauge.handing.Store(true)
	d.outGauge.handing.Store(false)
	d.handOffChanged()
	select {
	case h := <-calls:
		t.Errorf("OnHandOff(%v) for a change undone", h)
	case <-time.After(200 * time.Millisecond):
	}
}

// checkOrder runs the traffic of TestOrderUnderManyWorkers through a device
// with cfg, calling between (if set) before each batch i with the number
// of packets sent before it, and returns the device's stats.
func checkOrder(t *testing.T, cfg Config, between func(h *harness, i, sent int)) Stats {
	h := newHarness(t, cfg, true)
	tunnels := []tunnel{
		{reqid: 1, spi: 0x101, dst: netip.MustParsePrefix("198.19.1.0/24"), suite: "aes128gcm16-esn"},
		{reqid: 2, spi: 0x102, dst: netip.MustParsePrefix("198.19.2.0/24"), sport: 4500, dport: 4500},
		{reqid: 3, spi: 0x103, dst: netip.MustParsePrefix("2001:db8:3::/48"), local: local6, peer: peer6},
		{reqid: 4, spi: 0x104, dst: netip.MustParsePrefix("2001:db8:4::/48"), local: local6, peer: peer6, sport: 4500, dport: 4500, suite: "aes256-sha256"},
	}
	dsts := []netip.Addr{
		netip.MustParseAddr("198.19.1.9"), netip.MustParseAddr("198.19.2.9"),
		netip.MustParseAddr("2001:db8:3::9"), netip.MustParseAddr("2001:db8:4::9"),
	}
	for _, tn := range tunnels {
		h.add(tn)
	}
	const batches, per = 150, 40
	next := make([]uint64, len(tunnels))
	for i := range batches {
		pkts := make([][]byte, 0, per)
		for j := range per {
			k := (i*7 + j*j) % len(tunnels) // interleave the tunnels irregularly
			src := innerSrc4
			if dsts[k].Is6() {
				src = innerSrc6
			}
			pkts = append(pkts, udpPacket(src, dsts[k], 1000+uint16(k), 2000, next[k], 100+j*20, false))
			next[k]++
		}
		if between != nil {
			between(h, i, i*per)
		}
		h.tun.in <- pkts
	}
	const total = batches * per
	waitFor(t, "all packets back in the TUN", func() bool { return h.tun.count.Load() >= total })

	// Inner order per flow.
	seen := make(map[netip.Addr]uint64)
	for _, p := range h.tun.packets() {
		f, err := packet.ParseFlow(p)
		if err != nil {
			t.Fatal(err)
		}
		if c := counterOf(p); c != seen[f.Dst] {
			t.Fatalf("flow to %v: packet %d arrived when %d was due", f.Dst, c, seen[f.Dst])
		}
		seen[f.Dst]++
	}
	for k, d := range dsts {
		if seen[d] != next[k] {
			t.Errorf("flow to %v: %d packets back, %d sent", d, seen[d], next[k])
		}
	}
	// Outer sequence numbers per SPI: 1, 2, 3, ... in sending order.
	seqs := make(map[uint32]uint32)
	for _, p := range h.tx.packets() {
		spi, seq := outerSeq(p)
		if seq != seqs[spi]+1 {
			t.Fatalf("SPI %#x: sequence number %d after %d", spi, seq, seqs[spi])
		}
		seqs[spi] = seq
	}
	st := waitStats(t, h.d, "every packet counted", func(st Stats) bool {
		return st.TUNRxPackets == total && st.TxPackets == total && st.RxPackets == total && st.TUNTxPackets == total
	})
	for _, s := range h.db.SAs() {
		if got := s.Stats().Packets; got != uint64(next[s.ReqID()-1]) {
			t.Errorf("state %v accounted %d packets, want %d", s, got, next[s.ReqID()-1])
		}
	}
	return st
}

// oneOut sends one packet through a non-looped harness and returns the
// outer packet.
func (h *harness) oneOut(p []byte) []byte {
	h.t.Helper()
	before := len(h.tx.packets())
	h.tun.in <- [][]byte{p}
	waitFor(h.t, "an outer packet", func() bool { return len(h.tx.packets()) > before })
	return h.tx.packets()[before]
}

func TestDropsCounted(t *testing.T) {
	h := newHarness(t, Config{Workers: 4}, false)
	tn := tunnel{reqid: 7, spi: 0x700, dst: netip.MustParsePrefix("198.19.7.0/24")}
	out, in := h.add(tn)
	dst := netip.MustParseAddr("198.19.7.7")
	inner := udpPacket(innerSrc4, dst, 1, 2, 42, 200, false)
	outer := h.oneOut(inner)
	if out.Stats().Packets != 1 {
		t.Fatalf("outbound state accounted %d packets", out.Stats().Packets)
	}

	// Accepted once, then a replay.
	h.wire.inject(outer)
	waitFor(t, "the inner packet", func() bool { return h.tun.count.Load() == 1 })
	if got := h.tun.packets()[0]; !bytes.Equal(got, inner) {
		t.Fatalf("decrypted % x\nwant % x", got, inner)
	}
	h.wire.inject(outer)
	waitFor(t, "a replay drop", func() bool { return in.Stats().Drops[sa.DropReplay] == 1 })

	// The same packet twice in a row (usually in one batch, so both pass
	// the window check before either is recorded): one gets through.
	dup := h.oneOut(inner)
	before := h.tun.count.Load()
	h.wire.inject(dup)
	h.wire.inject(dup)
	waitFor(t, "a second replay drop", func() bool { return in.Stats().Drops[sa.DropReplay] == 2 })
	waitFor(t, "one copy", func() bool { return h.tun.count.Load() == before+1 })

	// Tampered: a flipped bit in the ciphertext.
	bad := append([]byte(nil), h.oneOut(inner)...)
	bad[len(bad)-20] ^= 1
	h.wire.inject(bad)
	waitFor(t, "an integrity drop", func() bool { return in.Stats().Drops[sa.DropIntegrity] == 1 })

	// Unknown SPI.
	unknown := append([]byte(nil), outer...)
	binary.BigEndian.PutUint32(unknown[packet.IPv4HeaderLen:], 0xdead)
	h.wire.inject(unknown)
	waitFor(t, "an invalid SPI", func() bool { return h.d.Stats().InvalidSPI == 1 })

	// Selector mismatch: an inbound state for another inner source.
	tn2 := tunnel{reqid: 8, spi: 0x800, dst: netip.MustParsePrefix("198.19.8.0/24"),
		inSelectors: []sa.Selector{{Src: netip.MustParsePrefix("198.19.200.0/24")}}}
	_, in2 := h.add(tn2)
	h.wire.inject(h.oneOut(udpPacket(innerSrc4, netip.MustParseAddr("198.19.8.8"), 1, 2, 0, 100, false)))
	waitFor(t, "a selector drop", func() bool { return in2.Stats().Drops[sa.DropSelector] == 1 })
	if n := h.db.Stats().Drops[sa.DropSelector]; n != 1 {
		t.Errorf("%d selector drops over the states, want 1", n)
	}

	// No state: an acquire event.
	sub := h.db.Subscribe(8)
	defer sub.Close()
	h.add(tunnel{reqid: 9, spi: 0x900, dst: netip.MustParsePrefix("198.19.9.0/24"), skipOut: true, skipIn: true})
	h.tun.in <- [][]byte{udpPacket(innerSrc4, netip.MustParseAddr("198.19.9.9"), 1, 2, 0, 100, false)}
	select {
	case ev := <-sub.Events():
		if ev.Kind != sa.EventAcquire || ev.ReqID != 9 || ev.Flow.Dst != netip.MustParseAddr("198.19.9.9") {
			t.Errorf("event %v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no acquire event")
	}
	waitFor(t, "a no-SA drop", func() bool { return h.d.Stats().NoSA == 1 })

	// Bypass and drop policies, no policy, malformed.
	for _, p := range []sa.Policy{
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.10.0/24")}, Dir: sa.DirOut, Action: sa.ActionBypass},
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.11.0/24")}, Dir: sa.DirOut, Action: sa.ActionDrop},
	} {
		if _, err := h.db.AddPolicy(p); err != nil {
			t.Fatal(err)
		}
	}
	h.tun.in <- [][]byte{
		udpPacket(innerSrc4, netip.MustParseAddr("198.19.10.1"), 1, 2, 0, 100, false),
		udpPacket(innerSrc4, netip.MustParseAddr("198.19.11.1"), 1, 2, 0, 100, false),
		udpPacket(innerSrc4, netip.MustParseAddr("198.19.12.1"), 1, 2, 0, 100, false),
		{0x45, 0, 0},
	}
	waitFor(t, "outbound drops", func() bool {
		s := h.d.Stats()
		return s.BypassInTUN == 1 && s.PolicyDrops == 1 && s.NoPolicy == 1 && s.Malformed == 1
	})

	// Keepalive and IKE on the encapsulation port, and a dummy-free run:
	// nothing of them reaches the TUN.
	ka := outerUDP(peer4, local4, 4500, 4500, []byte{0xff})
	ike := outerUDP(peer4, local4, 4500, 4500, append(make([]byte, 4), make([]byte, 28)...))
	h.wire.inject(ka)
	h.wire.inject(ike)
	waitFor(t, "keepalive and IKE counts", func() bool {
		s := h.d.Stats()
		return s.KeepalivesRx == 1 && s.IKE == 1
	})
	if n := h.tun.count.Load(); n != 2 {
		t.Errorf("%d packets reached the TUN, want 2", n)
	}
	want := [sa.NumDropReasons]uint64{sa.DropReplay: 2, sa.DropIntegrity: 1, sa.DropSelector: 1}
	if g := h.db.Stats(); g.Drops != want {
		t.Errorf("states' drops %v, want %v (2 replays, integrity, selector)", g.Drops, want)
	}
	if s, g := h.d.Stats(), h.db.Stats(); s.InvalidSPI != 1 || s.NoSA != 1 || g.Acquires != 1 {
		t.Errorf("InvalidSPI %d, NoSA %d, acquires %d; want 1 each", s.InvalidSPI, s.NoSA, g.Acquires)
	}
}

// outerUDP builds an IPv4 or IPv6 UDP datagram for the wire.
func outerUDP(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	hl := packet.IPv4HeaderLen
	if src.Is6() {
		hl = packet.IPv6HeaderLen
	}
	p := make([]byte, hl+packet.UDPHeaderLen+len(payload))
	packet.PutUDPHeader(p[hl:], sport, dport, len(payload))
	copy(p[hl+packet.UDPHeaderLen:], payload)
	if src.Is4() {
		packet.PutIPv4Header(p, packet.IPv4Header{TotalLen: uint16(len(p)), TTL: 64, Protocol: packet.ProtoUDP, Src: src, Dst: dst})
	} else {
		packet.PutIPv6Header(p, packet.IPv6Header{PayloadLen: uint16(len(p) - hl), NextHeader: packet.ProtoUDP, HopLimit: 64, Src: src, Dst: dst})
	}
	packet.SetUDPChecksum(p[hl:], src, dst)
	return p
}

func TestDeadStateNeverUsed(t *testing.T) {
	h := newHarness(t, Config{}, false)
	out, _ := h.add(tunnel{reqid: 3, spi: 0x300, dst: netip.MustParsePrefix("198.19.3.0/24")})
	dst := netip.MustParseAddr("198.19.3.3")
	h.oneOut(udpPacket(innerSrc4, dst, 1, 2, 0, 100, false))
	if err := h.db.DeleteSA(out.SPI(), peer4); err != nil {
		t.Fatal(err)
	}
	h.tun.in <- [][]byte{udpPacket(innerSrc4, dst, 1, 2, 1, 100, false)}
	waitFor(t, "a no-SA drop", func() bool { return h.d.Stats().NoSA == 1 })
	if n := len(h.tx.packets()); n != 1 {
		t.Errorf("%d packets sent, want 1 (none after the delete)", n)
	}
}

// TestInboundStateReplaced: once an inbound state is deleted the data
// plane keeps nothing of it: its packets are unknown SPIs, and a state
// added again with the same SPI starts with a window of its own, while the
// deleted one sees no more traffic.
func TestInboundStateReplaced(t *testing.T) {
	h := newHarness(t, Config{}, true)
	tn := tunnel{reqid: 3, spi: 0x300, dst: netip.MustParsePrefix("198.19.3.0/24")}
	_, in := h.add(tn)
	dst := netip.MustParseAddr("198.19.3.3")
	h.tun.in <- [][]byte{udpPacket(innerSrc4, dst, 1, 2, 0, 100, false)}
	waitFor(t, "the looped packet", func() bool { return h.tun.count.Load() == 1 })
	if err := h.db.DeleteSA(in.SPI(), local4); err != nil {
		t.Fatal(err)
	}
	h.tun.in <- [][]byte{udpPacket(innerSrc4, dst, 1, 2, 1, 100, false)}
	waitFor(t, "an invalid SPI", func() bool { return h.d.Stats().InvalidSPI == 1 })

	c := in.Config()
	c.EncKey, c.IntegKey = tunnelKeys(in.Suite(), tn.spi)
	in2, err := h.db.AddSA(c)
	if err != nil {
		t.Fatal(err)
	}
	if in2.ReplayTop() != 0 {
		t.Fatalf("new state's window starts at %d", in2.ReplayTop())
	}
	h.tun.in <- [][]byte{udpPacket(innerSrc4, dst, 1, 2, 2, 100, false)}
	waitFor(t, "a packet through the new state", func() bool { return h.tun.count.Load() == 2 })
	if got := counterOf(h.tun.packets()[1]); got != 2 {
		t.Errorf("packet %d came through, want 2", got)
	}
	if in2.Stats().Packets != 1 || in2.ReplayTop() != 3 {
		t.Errorf("new state: %d packets, window top %d; want 1 and 3", in2.Stats().Packets, in2.ReplayTop())
	}
	if in.Stats().Packets != 1 || in.ReplayTop() != 1 {
		t.Errorf("deleted state: %d packets, window top %d; want 1 and 1", in.Stats().Packets, in.ReplayTop())
	}
}

func TestQueueFullDropsWithoutBlocking(t *testing.T) {
	h := newHarness(t, Config{Workers: 1, QueueLen: 1}, false)
	h.tx.gate = make(chan struct{})
	h.add(tunnel{reqid: 1, spi: 0x100, dst: netip.MustParsePrefix("198.19.1.0/24")})
	dst := netip.MustParseAddr("198.19.1.1")
	const batches = 20
	for i := range batches {
		h.tun.in <- [][]byte{udpPacket(innerSrc4, dst, 1, 2, uint64(i), 100, false)}
	}
	// The sender is stuck, yet the reader takes every batch and drops
	// what does not fit.
	waitFor(t, "the reader to read everything", func() bool { return h.d.Stats().TUNRxPackets == batches })
	if d := h.d.Stats().QueueDrops; d < batches-3 {
		t.Errorf("QueueDrops = %d, want at least %d", d, batches-3)
	}
	close(h.tx.gate)
	waitFor(t, "the queued packets to leave", func() bool {
		s := h.d.Stats()
		return s.TxPackets+s.QueueDrops == batches
	})
	// What was sent is in order.
	for i, p := range h.tx.packets() {
		if _, seq := outerSeq(p); i > 0 && seq <= 1 {
			t.Errorf("packet %d has sequence number %d", i, seq)
		}
	}
}

var errTransientRead = errors.New("transient read error")
