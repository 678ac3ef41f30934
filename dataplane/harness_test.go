package dataplane

import (
	"encoding/binary"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

var (
	local4 = netip.MustParseAddr("198.18.0.1")
	peer4  = netip.MustParseAddr("198.18.0.2")
	local6 = netip.MustParseAddr("2001:db8::1")
	peer6  = netip.MustParseAddr("2001:db8::2")
)

// harness is one Device on fakes. With loop, what it sends comes back to
// its receiver, so that a packet read from the TUN is encrypted, received,
// decrypted and written back to the TUN.
type harness struct {
	t    testing.TB
	d    *Device
	db   *sa.DB
	tun  *fakeTUN
	tx   *fakeSender
	rx   *fakeReceiver
	wire *wire
}

func newHarness(t testing.TB, cfg Config, loop bool) *harness {
	return newHarnessWith(t, cfg, loop, nil)
}

// newHarnessWith is newHarness with rx, if not nil, as the device's only
// receiver instead of the wire's.
func newHarnessWith(t testing.TB, cfg Config, loop bool, rx conn.Receiver) *harness {
	t.Helper()
	return newHarnessLog(t, cfg, loop, rx, nil)
}

// newHarnessLog is newHarnessWith with the device logging to log.
func newHarnessLog(t testing.TB, cfg Config, loop bool, rx conn.Receiver, log *slog.Logger) *harness {
	t.Helper()
	return newHarnessPathMTU(t, cfg, loop, rx, log, nil)
}

// newHarnessPathMTU is newHarnessLog with pathMTU, if not nil, as the
// device's IO.PathMTU.
func newHarnessPathMTU(t testing.TB, cfg Config, loop bool, rx conn.Receiver, log *slog.Logger, pathMTU func(netip.Addr) (int, error)) *harness {
	t.Helper()
	h := &harness{t: t, db: sa.NewDB(sa.Options{Loopback: true}), tun: newFakeTUN(64, 1400), wire: newWire(1024)}
	h.tx = &fakeSender{record: true}
	if loop {
		h.tx.wire = h.wire
	}
	h.rx = newFakeReceiver(h.wire)
	if rx == nil {
		rx = h.rx
	}
	d, err := New(cfg, h.db, log)
	if err != nil {
		t.Fatal(err)
	}
	h.d = d
	statsHook = d.Stats
	h.tx.recv = []conn.Receiver{rx}
	if err := d.Start(IO{TUN: h.tun, Bind: h.tx, PathMTU: pathMTU, DeliverIKE: h.tx.DeliverIKE}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return h
}

func testKey(n int, seed byte) []byte {
	k := make([]byte, n)
	for i := range k {
		k[i] = seed + byte(i)
	}
	return k
}

// tunnel describes one protected inner network and the states for it.
type tunnel struct {
	reqid           uint32
	spi             uint32
	dst             netip.Prefix // inner destination network
	suite           string
	local, peer     netip.Addr // outer
	sport, dport    uint16     // ESP-in-UDP when dport != 0
	inSelectors     []sa.Selector
	df              uint8  // esp.DFMode
	window          uint32 // inbound replay window; 0: 128
	skipOut, skipIn bool
	ifID            uint32 // the policy's and the states' interface ID
	inIfID          uint32 // the inbound state's, if not ifID
	mode            sa.Mode
}

// tunnelKeys returns the keys add gives both states of a tunnel.
func tunnelKeys(suite crypto.Suite, spi uint32) (encKey, integKey []byte) {
	encKey, integKey = testKey(suite.EncKeyLen(), byte(spi)), testKey(suite.IntegKeyLen(), byte(spi>>8))
	// Every SPI gets keys of its own: sa refuses a key another state has.
	for _, k := range [][]byte{encKey, integKey} {
		if len(k) >= 4 {
			binary.BigEndian.PutUint32(k, spi)
		}
	}
	return encKey, integKey
}

// add installs the tunnel's outbound policy and, unless skipped, its
// outbound state and an inbound state with the same SPI and keys (so that a
// looped-back packet decrypts).
func (h *harness) add(tn tunnel) (out, in *sa.SA) {
	h.t.Helper()
	if tn.suite == "" {
		tn.suite = "aes128gcm16"
	}
	if !tn.local.IsValid() {
		tn.local, tn.peer = local4, peer4
	}
	suite, err := crypto.ParseSuite(tn.suite)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.db.AddPolicy(sa.Policy{
		Selector: sa.Selector{Dst: tn.dst}, Dir: sa.DirOut, Action: sa.ActionProtect,
		ReqID: tn.reqid, TmplSrc: tn.local, TmplDst: tn.peer, IfID: tn.ifID, Mode: tn.mode,
	}); err != nil {
		h.t.Fatal(err)
	}
	window := tn.window
	if window == 0 {
		window = 128
	}
	encKey, integKey := tunnelKeys(suite, tn.spi)
	base := sa.Config{
		SPI: tn.spi, Suite: suite, ReqID: tn.reqid, ReplayWindow: window,
		EncKey: encKey, IntegKey: integKey,
		EncapSrcPort: tn.sport, EncapDstPort: tn.dport, ECN: true, IfID: tn.ifID, Mode: tn.mode,
	}
	if !tn.skipOut {
		c := base
		c.Dir, c.Src, c.Dst = sa.DirOut, tn.local, tn.peer
		c.DF = dfMode(tn.df)
		if out, err = h.db.AddSA(c); err != nil {
			h.t.Fatal(err)
		}
	}
	if !tn.skipIn {
		c := base
		c.Dir, c.Src, c.Dst = sa.DirIn, tn.peer, tn.local
		c.Selectors = tn.inSelectors
		if tn.inIfID != 0 {
			c.IfID = tn.inIfID
		}
		if in, err = h.db.AddSA(c); err != nil {
			h.t.Fatal(err)
		}
	}
	return out, in
}

// udpPacket builds an IPv4 or IPv6 UDP packet of total length size (at
// least header + 8) whose payload starts with the 64-bit counter n.
func udpPacket(src, dst netip.Addr, sport, dport uint16, n uint64, size int, df bool) []byte {
	hl := packet.IPv4HeaderLen
	if src.Is6() {
		hl = packet.IPv6HeaderLen
	}
	size = max(size, hl+packet.UDPHeaderLen+8)
	p := make([]byte, size)
	u := p[hl:]
	packet.PutUDPHeader(u, sport, dport, len(u)-packet.UDPHeaderLen)
	binary.BigEndian.PutUint64(u[packet.UDPHeaderLen:], n)
	for i := packet.UDPHeaderLen + 8; i < len(u); i++ {
		u[i] = byte(i)
	}
	if src.Is4() {
		packet.PutIPv4Header(p, packet.IPv4Header{TotalLen: uint16(size), DF: df, TTL: 64, Protocol: packet.ProtoUDP, Src: src, Dst: dst})
	} else {
		packet.PutIPv6Header(p, packet.IPv6Header{PayloadLen: uint16(len(u)), NextHeader: packet.ProtoUDP, HopLimit: 64, Src: src, Dst: dst})
	}
	packet.SetUDPChecksum(u, src, dst)
	return p
}

// counterOf returns the counter udpPacket put in p.
func counterOf(p []byte) uint64 {
	hl := packet.IPv6HeaderLen
	if p[0]>>4 == 4 {
		hl = int(p[0]&0xf) * 4
	}
	return binary.BigEndian.Uint64(p[hl+packet.UDPHeaderLen:])
}

// totalDrops sums drops over their reasons: what states refused, by
// sa.Stats.Drops or sa.GlobalStats.Drops.
func totalDrops(drops [sa.NumDropReasons]uint64) uint64 {
	var n uint64
	for _, d := range drops {
		n += d
	}
	return n
}

// waitFor polls cond every millisecond for up to 30 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			if h, ok := t.(interface{ Logf(string, ...any) }); ok && statsHook != nil {
				h.Logf("%+v", statsHook())
			}
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitStats polls d's counters until ok holds and returns them, failing
// the test with the last ones after 30 s. The stages add a batch to the
// counters once it is done, after its packets were sent or written, so a
// test that saw the packets arrive waits for the counters too.
func waitStats(t testing.TB, d *Device, what string, ok func(Stats) bool) Stats {
	t.Helper()
	st := d.Stats()
	for deadline := time.Now().Add(30 * time.Second); !ok(st); st = d.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %+v", what, st)
		}
		time.Sleep(time.Millisecond)
	}
	return st
}

func dfMode(m uint8) esp.DFMode { return esp.DFMode(m) }

// statsHook, set by the latest harness, lets waitFor log the device's
// counters when it times out.
var statsHook func() Stats

// onWire returns the outer packet that the kernel's raw path sends for
// pk, which enc encapsulated in buf with sequence number seq.
func onWire(t testing.TB, enc *esp.Encapsulator, buf []byte, pk esp.Packet, seq uint64) []byte {
	t.Helper()
	p := conn.Packet{
		Buf: buf[:cap(buf)], Start: pk.ESP, End: pk.End, Endpoint: endpoint(&enc.Outer),
		TOS: pk.TOS, DF: pk.DF, ID: uint16(seq),
	}
	out, err := conn.PutOuter(&p)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
