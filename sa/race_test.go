package sa

import (
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConcurrentUse runs the control plane (adding, updating, deleting
// states and policies, allocating SPIs, ticking) against data-path
// goroutines (looking up, reserving, accounting, dropping, acquiring) and
// subscribers. Run with -race. Bounded by count.
func TestConcurrentUse(t *testing.T) {
	clock := newFakeClock()
	db := NewDB(Options{Now: clock.Now})
	sub := db.Subscribe(64)
	var subWG sync.WaitGroup
	subWG.Add(1)
	go func() {
		defer subWG.Done()
		for range sub.Events() {
		}
	}()
	// States that are never deleted: the data path must always find them.
	stable := mustAdd(t, db, testConfig(0x100, DirIn, 1000))
	stableOut := mustAdd(t, db, testConfig(0x101, DirOut, 1000))
	if _, err := db.AddPolicy(Policy{Selector: Selector{Dst: pfx("198.19.0.0/16")}, Dir: DirOut, ReqID: 1000}); err != nil {
		t.Fatal(err)
	}

	var stop atomic.Bool
	var missed atomic.Int64
	var wg sync.WaitGroup
	const readers = 4
	for w := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; !stop.Load() && i < 1_000_000; i++ {
				if db.LookupInbound(0x100) != stable || db.OutboundSA(1000) != stableOut {
					missed.Add(1)
				}
				f := flow("198.18.0.1", "198.19.1.2", 6, uint16(r.IntN(100)), 80)
				if p, ok := db.LookupPolicy(0, DirOut, f); !ok || p.ReqID == 0 {
					missed.Add(1)
				}
				spi := 0x1000 + uint32(r.IntN(64))
				if s := db.LookupInbound(spi); s != nil {
					s.Account(1, 100)
					s.Drop(DropReplay, 1)
					s.AllowsInner(f)
					_ = s.Decapsulator()
				}
				if s := db.OutboundSA(uint32(r.IntN(8))); s != nil {
					s.ReserveSeq(16)
					_ = s.Encapsulator()
					s.Account(16, 1600)
				}
				db.Acquire(Policy{Index: uint32(r.IntN(4)) * 8}, f)
			}
		}()
	}
	wg.Add(1)
	go func() { // control plane
		defer wg.Done()
		r := rand.New(rand.NewPCG(9, 9))
		for i := range 3000 {
			switch r.IntN(8) {
			case 0, 1:
				c := testConfig(0x1000+uint32(r.IntN(64)), DirIn, uint32(r.IntN(8)))
				c.Hard.Packets = 50
				db.AddSA(c)
			case 2:
				c := testConfig(0x2000+uint32(r.IntN(64)), DirOut, uint32(r.IntN(8)))
				c.Soft.Packets, c.Hard.Bytes = 100, 20000
				db.AddSA(c)
			case 3:
				db.DeleteSA(0x1000+uint32(r.IntN(64)), local)
				db.DeleteSA(0x2000+uint32(r.IntN(64)), remote)
			case 4:
				if s := db.LookupInbound(0x1000 + uint32(r.IntN(64))); s != nil {
					c := s.Config()
					c.Src = netip.AddrFrom4([4]byte{198, 18, 1, byte(r.IntN(256))})
					c.ECN = !c.ECN
					db.UpdateSA(c)
				}
			case 5:
				p := randPolicy(r)
				db.UpdatePolicy(p)
				if r.IntN(2) == 0 {
					db.DeletePolicy(p.ID())
				}
			case 6:
				if spi, err := db.AllocSPI(0x1000, 0x103f); err == nil && r.IntN(2) == 0 {
					db.DeleteSA(spi, netip.Addr{})
				}
			case 7:
				clock.Advance(300 * time.Millisecond)
				db.tick()
				_ = db.Stats()
				_ = db.SAs()
				_ = db.Policies()
			}
			if i%500 == 499 {
				s2 := db.Subscribe(1) // subscribe and leave while events fly
				s2.Close()
			}
		}
		stop.Store(true)
	}()
	wg.Wait()
	sub.Close()
	subWG.Wait()
	if missed.Load() != 0 {
		t.Fatalf("data path missed stable entries %d times", missed.Load())
	}
	// Everything the control plane left is consistent: every installed
	// state is alive and found by its own lookups.
	for _, s := range db.SAs() {
		if s.State() == StateLarval {
			continue
		}
		if !s.Alive() {
			t.Errorf("listed state %v is not alive", s)
		}
		if got, ok := db.GetSA(s.SPI(), s.Config().Dst); !ok || got != s {
			t.Errorf("GetSA misses %v", s)
		}
		if s.Dir() == DirIn && db.LookupInbound(s.SPI()) != s {
			t.Errorf("LookupInbound misses %v", s)
		}
	}
	for reqid := range uint32(8) {
		if s := db.OutboundSA(reqid); s != nil && (!s.Alive() || s.ReqID() != reqid) {
			t.Errorf("OutboundSA(%d) = %v", reqid, s)
		}
	}
}
