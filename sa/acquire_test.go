package sa

import (
	"net/netip"
	"testing"
	"time"
)

// manyDsts returns n distinct destinations in 198.19.0.0/16.
func manyDsts(n int) []netip.Addr {
	d := make([]netip.Addr, n)
	for i := range d {
		d[i] = netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
	}
	return d
}

// TestAcquireGlobalRate: 50,000 packets to 20,000 destinations at one
// instant raise DefaultAcquireRate acquires, not one per destination; the
// rest count as suppressed; the budget comes back at the rate, and the
// limit per policy and destination still holds beside it.
func TestAcquireGlobalRate(t *testing.T) {
	db, clock := newTestDB(t) // the zero Options: the default rate
	p := Policy{Index: 8, ReqID: 1}
	dsts := manyDsts(20000)
	f := flow("198.18.0.10", "198.19.0.0", 6, 5000, 80)
	fired := 0
	for i := range 50000 {
		f.Dst = dsts[i%len(dsts)]
		if db.Acquire(p, f) {
			fired++
		}
	}
	g := db.Stats()
	if fired != DefaultAcquireRate || g.Acquires != DefaultAcquireRate || g.AcquiresSuppressed != 50000-DefaultAcquireRate {
		t.Fatalf("50,000 packets to 20,000 destinations: %d acquires (%d counted), %d suppressed; want %d and %d",
			fired, g.Acquires, g.AcquiresSuppressed, DefaultAcquireRate, 50000-DefaultAcquireRate)
	}

	// One token comes back every 1 s / rate; a destination that has had
	// its acquire within AcquireInterval stays suppressed even so.
	clock.Advance(time.Second / DefaultAcquireRate)
	f.Dst = dsts[0] // acquired at the start
	if db.Acquire(p, f) {
		t.Error("acquire for a destination within its interval fired")
	}
	f.Dst = netip.MustParseAddr("198.20.0.1") // new
	if !db.Acquire(p, f) {
		t.Error("acquire with a token back suppressed")
	}
	f.Dst = netip.MustParseAddr("198.20.0.2")
	if db.Acquire(p, f) {
		t.Error("second acquire on one token fired")
	}

	// Sustained: 5 packets a millisecond to fresh destinations for 10 s
	// raise the burst plus the rate for 10 s, no more, and no fewer.
	db, clock = newTestDB(t)
	start := db.Stats()
	for ms := range 10000 {
		for j := range 5 {
			f.Dst = dsts[(ms*5+j)%len(dsts)]
			db.Acquire(p, f)
		}
		clock.Advance(time.Millisecond)
	}
	g = db.Stats()
	if n := g.Acquires - start.Acquires; n < 10*DefaultAcquireRate || n > 11*DefaultAcquireRate {
		t.Errorf("10 s of 5,000 packets a second: %d acquires, want %d to %d", n, 10*DefaultAcquireRate, 11*DefaultAcquireRate)
	}
	if g.Acquires+g.AcquiresSuppressed != 50000 {
		t.Errorf("acquires %d + suppressed %d != 50,000 calls", g.Acquires, g.AcquiresSuppressed)
	}
}

// TestAcquireRateOptions: AcquireRate sets the budget; negative lifts it.
func TestAcquireRateOptions(t *testing.T) {
	for _, c := range []struct {
		rate, want int
	}{{0, DefaultAcquireRate}, {5, 5}, {-1, 3000}} {
		clock := newFakeClock()
		db := NewDB(Options{Now: clock.Now, AcquireRate: c.rate})
		f := flow("198.18.0.10", "198.19.0.0", 6, 5000, 80)
		fired := 0
		for _, d := range manyDsts(3000) {
			f.Dst = d
			if db.Acquire(Policy{Index: 8}, f) {
				fired++
			}
		}
		if fired != c.want {
			t.Errorf("AcquireRate %d: %d acquires for 3,000 destinations, want %d", c.rate, fired, c.want)
		}
	}
}

// TestAcquireOverBudgetNoAlloc: an acquire the global limit holds back
// takes no lock and does not allocate either.
func TestAcquireOverBudgetNoAlloc(t *testing.T) {
	clock := newFakeClock()
	db := NewDB(Options{Now: clock.Now, AcquireInterval: -1, AcquireRate: 1})
	f := flow("198.18.0.10", "198.19.0.10", 6, 5000, 80)
	p := Policy{Index: 8, ReqID: 1}
	if !db.Acquire(p, f) {
		t.Fatal("first acquire suppressed")
	}
	if n := testing.AllocsPerRun(1000, func() {
		if db.Acquire(p, f) {
			t.Fatal("not suppressed")
		}
	}); n != 0 {
		t.Errorf("Acquire over the budget allocates %v times", n)
	}
}
