package sa

import (
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/packet"
)

// TestAddSARoundTrip installs an outbound state in one DB and the matching
// inbound state in another, and sends a packet through them: AddSA built
// working transforms, an encapsulator and a decapsulator.
func TestAddSARoundTrip(t *testing.T) {
	for _, suite := range []crypto.Suite{gcm128, gcm128ESN, cbcSHA256} {
		t.Run(suite.String(), func(t *testing.T) {
			tx, _ := newTestDB(t)
			rx, _ := newTestDB(t)
			out := testConfig(0x1001, DirOut, 1)
			out.Suite, out.EncKey, out.IntegKey = suite, testKey(suite.EncKeyLen()), testKey(suite.IntegKeyLen())
			out.EncapSrcPort, out.EncapDstPort = 4500, 4500
			in := out
			in.Dir = DirIn
			os := mustAdd(t, tx, out)
			is := mustAdd(t, rx, in)
			if os.Decapsulator() != nil || is.Encapsulator() != nil {
				t.Fatal("a state has the codec of the other direction")
			}
			enc := os.Encapsulator()
			if enc.SPI != 0x1001 || enc.Outer.Src != local || enc.Outer.Dst != remote || enc.Outer.DstPort != 4500 {
				t.Fatalf("encapsulator %+v", enc)
			}
			dec := is.Decapsulator()
			if dec.Replay == nil || dec.Replay.Size() != 64 || dec.Replay.ESN() != suite.ESN {
				t.Fatalf("decapsulator replay window %+v", dec.Replay)
			}
			f := flow("198.19.0.1", "198.19.1.1", 17, 1000, 2000)
			buf, n := innerPacket(t, f, 100, esp.MaxHeadroom)
			want := append([]byte(nil), buf[esp.MaxHeadroom:]...)
			first, granted := os.ReserveSeq(1)
			if first != 1 || granted != 1 {
				t.Fatalf("ReserveSeq(1) = %d, %d", first, granted)
			}
			p, err := enc.Encapsulate(buf, esp.MaxHeadroom, n, first)
			if err != nil {
				t.Fatal(err)
			}
			espPkt := buf[p.ESP:p.End]
			spi, _ := esp.SPI(espPkt)
			if rx.LookupInbound(spi) != is {
				t.Fatalf("LookupInbound(0x%x) did not find the inbound state", spi)
			}
			inner, seq, err := dec.Open(espPkt, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := dec.Replay.Update(seq); err != nil {
				t.Fatal(err)
			}
			if seq != 1 || string(inner) != string(want) {
				t.Fatalf("decapsulated seq %d, %d bytes; want seq 1 and the original %d bytes", seq, len(inner), len(want))
			}
			if is.ReplayTop() != 1 || os.ReplayTop() != 0 {
				t.Errorf("ReplayTop: inbound %d, outbound %d; want 1 and 0", is.ReplayTop(), os.ReplayTop())
			}
			gf, _ := packet.ParseFlow(inner)
			if !is.AllowsInner(gf) {
				t.Error("a state without selectors refused a packet")
			}
		})
	}
}

func TestAddSAValidation(t *testing.T) {
	db, _ := newTestDB(t)
	mod := func(f func(*Config)) Config {
		c := testConfig(0x2000, DirOut, 1)
		f(&c)
		return c
	}
	cases := map[string]Config{
		"spi 0":           mod(func(c *Config) { c.SPI = 0 }),
		"fwd state":       mod(func(c *Config) { c.Dir = DirFwd }),
		"no dst":          mod(func(c *Config) { c.Dst = netip.Addr{} }),
		"mixed families":  mod(func(c *Config) { c.Dst = netip.MustParseAddr("2001:db8::1") }),
		"zone":            mod(func(c *Config) { c.Src = netip.MustParseAddr("fe80::1%eth0"); c.Dst = netip.MustParseAddr("fe80::2") }),
		"unknown suite":   mod(func(c *Config) { c.Suite = crypto.Suite{Encryption: crypto.Encr3DES, KeyBits: 192} }),
		"short key":       mod(func(c *Config) { c.EncKey = c.EncKey[:19] }),
		"stray integ key": mod(func(c *Config) { c.IntegKey = testKey(32) }),
		"one encap port":  mod(func(c *Config) { c.EncapDstPort = 4500 }),
		"dscp 64":         mod(func(c *Config) { c.DSCP = 64 }),
		"df mode":         mod(func(c *Config) { c.DF = esp.DFClear + 1 }),
		"tfc":             mod(func(c *Config) { c.TFCPadTo = -1 }),
		"selector":        mod(func(c *Config) { c.Selectors = []Selector{{SrcPorts: PortRange{5, 4}}} }),
	}
	for name, c := range cases {
		if _, err := db.AddSA(c); err == nil {
			t.Errorf("%s: AddSA accepted %v", name, c)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if n := len(db.SAs()); n != 0 {
		t.Errorf("%d states installed by failed AddSA calls", n)
	}
}

func TestAddSADuplicates(t *testing.T) {
	db, _ := newTestDB(t)
	mustAdd(t, db, testConfig(0x3000, DirIn, 1))
	if _, err := db.AddSA(testConfig(0x3000, DirIn, 2)); !errors.Is(err, ErrStateExists) {
		t.Errorf("same SPI and dst: %v", err)
	}
	other := testConfig(0x3000, DirIn, 2)
	other.Dst = netip.MustParseAddr("198.18.0.9")
	if _, err := db.AddSA(other); !errors.Is(err, ErrStateExists) {
		t.Errorf("same inbound SPI, other dst: %v", err)
	}
	// An outbound state may have the SPI of an inbound one: the peer chose it.
	if _, err := db.AddSA(testConfig(0x3000, DirOut, 1)); err != nil {
		t.Errorf("outbound state with an inbound state's SPI: %v", err)
	}
	// Outbound states to different peers may share an SPI.
	o2 := testConfig(0x3000, DirOut, 3)
	o2.Dst = netip.MustParseAddr("198.18.0.3")
	o2.EncKey = testStateKey(len(o2.EncKey), 0x3fff, DirOut) // every state has its own key
	if _, err := db.AddSA(o2); err != nil {
		t.Errorf("outbound state with another peer's SPI: %v", err)
	}
}

func TestLookups(t *testing.T) {
	db, _ := newTestDB(t)
	in := mustAdd(t, db, testConfig(0x4000, DirIn, 1))
	out := mustAdd(t, db, testConfig(0x4001, DirOut, 1))
	if db.LookupInbound(0x4000) != in {
		t.Error("LookupInbound missed the inbound state")
	}
	if db.LookupInbound(0x4001) != nil {
		t.Error("LookupInbound returned an outbound state")
	}
	if s, ok := db.GetSA(0x4000, local); !ok || s != in {
		t.Error("GetSA missed the inbound state")
	}
	if _, ok := db.GetSA(0x4000, remote); ok {
		t.Error("GetSA ignored the destination")
	}
	if s, ok := db.GetSA(0x4001, netip.AddrFrom16(remote.As16())); !ok || s != out {
		t.Error("GetSA with an IPv4-mapped destination missed the state")
	}
	if db.OutboundSA(1) != out || db.OutboundSA(2) != nil {
		t.Error("OutboundSA wrong")
	}
	if got := db.SAs(); len(got) != 2 || got[0] != in || got[1] != out {
		t.Errorf("SAs() = %v", got)
	}
	if in.SPI() != 0x4000 || in.Dir() != DirIn || in.ReqID() != 1 || in.Suite() != gcm128 || in.State() != StateValid || !in.Alive() {
		t.Errorf("accessors: %v", in)
	}
}

// TestOutboundSARekey follows charon's make-before-break rekeying: the new
// outbound state is added before the old one is deleted.
func TestOutboundSARekey(t *testing.T) {
	db, _ := newTestDB(t)
	old := mustAdd(t, db, testConfig(0x5000, DirOut, 9))
	newer := mustAdd(t, db, testConfig(0x5001, DirOut, 9))
	if db.OutboundSA(9) != newer {
		t.Fatal("OutboundSA did not move to the new state")
	}
	if err := db.DeleteSA(0x5000, remote); err != nil {
		t.Fatal(err)
	}
	if db.OutboundSA(9) != newer {
		t.Fatal("deleting the old state changed OutboundSA")
	}
	// Deleting the newest falls back to an older live one.
	third := mustAdd(t, db, testConfig(0x5002, DirOut, 9))
	if err := db.DeleteSA(third.SPI(), remote); err != nil {
		t.Fatal(err)
	}
	if db.OutboundSA(9) != newer {
		t.Fatal("deleting the newest did not fall back to the older live state")
	}
	if err := db.DeleteSA(0x5001, remote); err != nil {
		t.Fatal(err)
	}
	if db.OutboundSA(9) != nil || old.Alive() {
		t.Fatal("states survive deletion")
	}
}

func TestDeleteSA(t *testing.T) {
	db, _ := newTestDB(t)
	zeroed := watchZero(t)
	s := mustAdd(t, db, testConfig(0x6000, DirIn, 1))
	if err := db.DeleteSA(0x6000, remote); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete with the wrong dst: %v", err)
	}
	if err := db.DeleteSA(0x6000, local); err != nil {
		t.Fatal(err)
	}
	if s.Alive() || s.State() != StateDead || db.LookupInbound(0x6000) != nil {
		t.Error("deleted state still alive or found")
	}
	if !zeroed(s) || !keysZero(s) {
		t.Error("deleted state's keys not zeroed")
	}
	if err := db.DeleteSA(0x6000, local); !errors.Is(err, ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	// The SPI is free again.
	mustAdd(t, db, testConfig(0x6000, DirIn, 1))
}

func TestFlushSAs(t *testing.T) {
	db, _ := newTestDB(t)
	zeroed := watchZero(t)
	var ss []*SA
	for i := range uint32(10) {
		ss = append(ss, mustAdd(t, db, testConfig(0x7000+i, Direction(i%2), 1)))
	}
	if _, err := db.AllocSPI(0x8000, 0x8fff); err != nil {
		t.Fatal(err)
	}
	db.FlushSAs()
	if n := len(db.SAs()); n != 0 {
		t.Fatalf("%d states after flush", n)
	}
	for _, s := range ss {
		if s.Alive() || !zeroed(s) || db.LookupInbound(s.SPI()) != nil {
			t.Fatalf("%v survived the flush", s)
		}
	}
	if db.OutboundSA(1) != nil {
		t.Fatal("OutboundSA after flush")
	}
}

func TestAllocSPI(t *testing.T) {
	db, clock := newTestDB(t)
	if _, err := db.AllocSPI(0, 255); err == nil {
		t.Error("AllocSPI(0, 255) handed out a reserved SPI")
	}
	if _, err := db.AllocSPI(0x2000, 0x1000); err == nil {
		t.Error("AllocSPI accepted an empty range")
	}
	// A small range: every SPI once, then none; never below 256.
	mustAdd(t, db, testConfig(260, DirIn, 1)) // taken by a state
	seen := map[uint32]bool{}
	for range 300 - 256 {
		spi, err := db.AllocSPI(0, 300)
		if err != nil {
			t.Fatal(err)
		}
		if spi < 256 || spi > 300 || spi == 260 || seen[spi] {
			t.Fatalf("AllocSPI(0, 300) = %d (seen before: %v)", spi, seen[spi])
		}
		seen[spi] = true
	}
	if spi, err := db.AllocSPI(0, 300); err == nil {
		t.Fatalf("AllocSPI in a full range returned %d", spi)
	}
	if g := db.Stats(); g.Larval != 300-256 || g.States != 1 {
		t.Fatalf("stats %d larval %d states", g.Larval, g.States)
	}
	var larval *SA
	for _, s := range db.SAs() {
		// Not 257 or 258: they are consumed and released below, and the
		// expiry checked at the end is of one that stays reserved.
		if s.State() == StateLarval && s.SPI() != 257 && s.SPI() != 258 {
			larval = s
		}
	}
	if larval == nil || larval.Alive() || db.LookupInbound(larval.SPI()) != nil {
		t.Fatal("a reservation is listed wrongly or found by LookupInbound")
	}
	// AddSA consumes a reservation; DeleteSA releases one whatever dst.
	mustAdd(t, db, testConfig(257, DirIn, 1))
	if err := db.DeleteSA(258, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	if g := db.Stats(); g.Larval != 300-256-2 {
		t.Fatalf("%d reservations after consume and release", g.Larval)
	}
	if spi, err := db.AllocSPI(258, 258); err != nil || spi != 258 {
		t.Fatalf("released SPI not handed out again: %d, %v", spi, err)
	}
	// Reservations expire after Options.SPIReservation (60 s).
	clock.Advance(59 * time.Second)
	db.tick()
	if _, err := db.AllocSPI(0, 300); err == nil {
		t.Fatal("reservations expired early")
	}
	clock.Advance(time.Second)
	db.tick()
	if g := db.Stats(); g.Larval != 0 {
		t.Fatalf("%d reservations left after expiry", g.Larval)
	}
	if larval.State() != StateDead {
		t.Errorf("expired reservation is %v", larval.State())
	}
	if _, err := db.AllocSPI(0, 300); err != nil {
		t.Fatalf("expired reservations not released: %v", err)
	}
	// A large range hands out random, distinct SPIs.
	big := map[uint32]bool{}
	for range 1000 {
		spi, err := db.AllocSPI(0xc0000000, 0xcfffffff)
		if err != nil || big[spi] || spi < 0xc0000000 || spi > 0xcfffffff {
			t.Fatalf("AllocSPI = 0x%x, %v", spi, err)
		}
		big[spi] = true
	}
}

// TestAllocSPIConcurrent: callers allocating at once never get the same
// SPI.
func TestAllocSPIConcurrent(t *testing.T) {
	db, _ := newTestDB(t)
	const workers, each = 4, 200
	got := make([][]uint32, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				spi, err := db.AllocSPI(0x1000, 0x1000+workers*each-1) // exactly enough
				if err != nil {
					t.Error(err)
					return
				}
				got[w] = append(got[w], spi)
			}
		}()
	}
	wg.Wait()
	seen := map[uint32]bool{}
	for _, l := range got {
		for _, spi := range l {
			if seen[spi] {
				t.Fatalf("SPI 0x%x handed out twice", spi)
			}
			seen[spi] = true
		}
	}
	if len(seen) != workers*each {
		t.Fatalf("%d SPIs handed out, want %d", len(seen), workers*each)
	}
}

// TestAllowsInner: an inbound state's selectors are seen from the packets
// that arrive: Src is the remote network.
func TestAllowsInner(t *testing.T) {
	db, _ := newTestDB(t)
	c := testConfig(0x9000, DirIn, 1)
	c.Selectors = []Selector{
		{Src: pfx("198.19.1.0/24"), Dst: pfx("198.19.0.0/24")},
		{Src: pfx("2001:db8:1::/48"), Dst: pfx("2001:db8::/48"), Proto: 58},
	}
	in := mustAdd(t, db, c)
	cases := []struct {
		f    packet.Flow
		want bool
	}{
		{flow("198.19.1.5", "198.19.0.5", 6, 1, 2), true},
		{flow("198.19.0.5", "198.19.1.5", 6, 1, 2), false}, // the wrong way round
		{flow("198.19.2.5", "198.19.0.5", 6, 1, 2), false},
		{flow("2001:db8:1::5", "2001:db8::5", 58, 128, 0), true},
		{flow("2001:db8:1::5", "2001:db8::5", 6, 1, 2), false},
	}
	for _, tc := range cases {
		if got := in.AllowsInner(tc.f); got != tc.want {
			t.Errorf("AllowsInner(%v -> %v proto %d) = %v, want %v", tc.f.Src, tc.f.Dst, tc.f.Proto, got, tc.want)
		}
	}
	f := cases[0].f
	if n := testing.AllocsPerRun(100, func() { in.AllowsInner(f) }); n != 0 {
		t.Errorf("AllowsInner allocates %v times", n)
	}
	// The state's config keeps its own copy of the selectors.
	c.Selectors[0].Src = pfx("0.0.0.0/0")
	if in.AllowsInner(flow("198.19.2.5", "198.19.0.5", 6, 1, 2)) {
		t.Error("changing the caller's slice changed the state's selectors")
	}
}
