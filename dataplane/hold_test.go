package dataplane

import (
	"errors"
	"net/netip"
	"sync"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/sa"
)

// transformZeroed reports whether tr, the transform of a state of tunnel
// spi, was zeroed: whether it fails to open a packet that a transform with
// the same keys sealed (a zeroed transform refuses everything).
func transformZeroed(t *testing.T, tr crypto.Transform, spi uint32) bool {
	t.Helper()
	ek, ik := tunnelKeys(tr.Suite(), spi)
	ref, err := crypto.New(tr.Suite(), ek, ik)
	if err != nil {
		t.Fatal(err)
	}
	enc := esp.Encapsulator{SPI: spi, Transform: ref, Outer: esp.Outer{Src: peer4, Dst: local4}}
	inner := udpPacket(innerSrc4, netip.MustParseAddr("198.19.1.1"), 1, 2, 0, 60, false)
	buf := make([]byte, esp.MaxHeadroom+len(inner)+esp.MaxTrailer)
	copy(buf[esp.MaxHeadroom:], inner)
	p, err := enc.Encapsulate(buf, esp.MaxHeadroom, len(inner), 9)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tr.Open(buf[p.ESP:p.End], 9)
	if err != nil && !errors.Is(err, crypto.ErrAuthentication) {
		t.Fatalf("probe of spi %#x: %v", spi, err)
	}
	return err != nil
}

// TestDeleteUnderLoad rekeys and deletes the states of four looped-back
// tunnels while 8 workers encrypt and decrypt a steady stream through
// them (run with -race). The data path holds each state for its batches'
// crypto, so nothing panics or races, no packet fails its ICV (a
// transform wiped under a worker would seal garbage or refuse good
// packets), and once the device has finished every batch the transform of
// every removed state is zeroed while those of live states are not.
func TestDeleteUnderLoad(t *testing.T) {
	h := newHarness(t, Config{Workers: 8, QueueLen: 64}, true)
	h.tun.record = false
	const tunnels = 4
	var all []*sa.SA
	dsts := make([]netip.Addr, tunnels)
	for k := range tunnels {
		tn := tunnel{reqid: uint32(k + 1), spi: 0x1000 * uint32(k+1), dst: netip.MustParsePrefix(netip.AddrFrom4([4]byte{198, 19, byte(k + 1), 0}).String() + "/24")}
		out, in := h.add(tn)
		all = append(all, out, in)
		dsts[k] = netip.AddrFrom4([4]byte{198, 19, byte(k + 1), 9})
	}
	tmpl := make([][]byte, 64)
	for i := range tmpl {
		tmpl[i] = udpPacket(innerSrc4, dsts[i%tunnels], 1, 2, uint64(i), 200+i*8, false)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // traffic, until the rekeys are done
		defer wg.Done()
		for range 100000 {
			select {
			case h.tun.in <- tmpl:
			case <-stop:
				return
			}
		}
	}()
	// Rekey as charon does: add a new pair of states, then delete the
	// old pair; every tenth round delete the old pair first.
	spis := make([]uint32, tunnels)
	for k := range spis {
		spis[k] = 0x1000 * uint32(k+1)
	}
	for round := range 300 {
		k := round % tunnels
		old := spis[k]
		spis[k]++
		var cfgs []sa.Config
		for _, s := range []*sa.SA{h.db.OutboundSA(uint32(k + 1)), h.db.LookupInbound(old)} {
			c := s.Config()
			c.SPI = spis[k]
			c.EncKey, c.IntegKey = tunnelKeys(c.Suite, spis[k])
			cfgs = append(cfgs, c)
		}
		deleteOld := func() {
			if err := h.db.DeleteSA(old, peer4); err != nil {
				t.Fatal(err)
			}
			if err := h.db.DeleteSA(old, local4); err != nil {
				t.Fatal(err)
			}
		}
		if round%10 == 9 {
			deleteOld()
		}
		for _, c := range cfgs {
			s, err := h.db.AddSA(c)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, s)
		}
		if round%10 != 9 {
			deleteOld()
		}
		// Let a few batches through before the next round.
		target := h.d.Stats().RxPackets + 256
		waitFor(t, "traffic between rekeys", func() bool { return h.d.Stats().RxPackets >= target })
	}
	close(stop)
	wg.Wait()
	// What every state, removed ones included, refused.
	statesDrops := func() uint64 {
		var n uint64
		for _, s := range all {
			n += totalDrops(s.Stats().Drops)
		}
		return n
	}
	// Every packet read from the TUN ends up in exactly one of these.
	waitFor(t, "the pipeline to drain", func() bool {
		s := h.d.Stats()
		return len(h.tun.in) == 0 && s.RxPackets == s.TxPackets &&
			s.TUNRxPackets == s.TUNTxPackets+s.NoSA+s.InvalidSPI+statesDrops()+s.QueueDrops
	})
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}

	st := h.d.Stats()
	if st.TUNTxPackets == 0 {
		t.Fatalf("no traffic went through: %+v", st)
	}
	var dead, integrity uint64
	var drops [sa.NumDropReasons]uint64
	for _, s := range all {
		for r, n := range s.Stats().Drops {
			drops[r] += n
		}
		integrity += s.Stats().Drops[sa.DropIntegrity]
		var tr crypto.Transform
		if e := s.Encapsulator(); e != nil {
			tr = e.Transform
		} else {
			tr = s.Decapsulator().Transform
		}
		zeroed := transformZeroed(t, tr, s.SPI())
		if zeroed != !s.Alive() {
			t.Errorf("%v: transform zeroed %v", s, zeroed)
		}
		if !s.Alive() {
			dead++
		}
	}
	if integrity != 0 {
		t.Errorf("%d packets failed their ICV", integrity)
	}
	t.Logf("%d states removed; drops %v; %+v", dead, drops, st)
}
