package sa

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
)

func TestGlobalStats(t *testing.T) {
	db, _ := newTestDB(t)
	a := mustAdd(t, db, testConfig(0x5100, DirOut, 1))
	b := mustAdd(t, db, testConfig(0x5101, DirIn, 1))
	db.AddPolicy(Policy{Dir: DirOut})
	if _, err := db.AllocSPI(0x6000, 0x6fff); err != nil {
		t.Fatal(err)
	}
	a.Account(10, 1000)
	b.Account(5, 500)
	b.Drop(DropReplay, 3)
	b.Drop(DropReason(200), 2) // out of range: other
	if err := db.DeleteSA(0x5100, remote); err != nil {
		t.Fatal(err)
	}
	g := db.Stats()
	want := GlobalStats{States: 1, Larval: 1, Policies: 1, Packets: 15, Bytes: 1500}
	want.Drops[DropReplay], want.Drops[DropOther] = 3, 2
	if g != want {
		t.Errorf("Stats() = %+v\nwant       %+v", g, want)
	}
	if st := b.Stats(); st.Drops[DropReplay] != 3 || st.Drops[DropOther] != 2 {
		t.Errorf("state drops %v", st.Drops)
	}
}

func TestDropReasonOf(t *testing.T) {
	cases := map[error]DropReason{
		esp.ErrReplay:                            DropReplay,
		crypto.ErrAuthentication:                 DropIntegrity,
		esp.ErrPadding:                           DropPadding,
		esp.ErrMalformed:                         DropMalformed,
		crypto.ErrMalformed:                      DropMalformed,
		esp.ErrNextHeader:                        DropNextHeader,
		esp.ErrInner:                             DropInner,
		esp.ErrDummy:                             DropDummy,
		esp.ErrECNDrop:                           DropECN,
		esp.ErrTooBig:                            DropTooBig,
		esp.ErrTailroom:                          DropTooBig,
		errors.New("something else"):             DropOther,
		fmt.Errorf("wrapped: %w", esp.ErrReplay): DropReplay,
	}
	for err, want := range cases {
		if got := DropReasonOf(err); got != want {
			t.Errorf("DropReasonOf(%v) = %v, want %v", err, got, want)
		}
	}
	for r := range NumDropReasons {
		if r.String() == "" || r.String()[0] == 'd' && r != DropDummy {
			t.Errorf("reason %d has no name: %q", r, r.String())
		}
	}
}

// TestStatsOutsideTheLock: Stats sums the states after releasing the
// state lock, so AddSA and DeleteSA run while it sums (they would
// deadlock here otherwise). A state deleted between the copy of the list
// and the sum counts once, with what it had when it was removed, and the
// next Stats agrees; a state added meanwhile counts from the next Stats.
func TestStatsOutsideTheLock(t *testing.T) {
	db, _ := newTestDB(t)
	a := mustAdd(t, db, testConfig(0x5200, DirIn, 1))
	b := mustAdd(t, db, testConfig(0x5201, DirIn, 2))
	a.Account(10, 1000)
	b.Account(1, 100)
	b.Drop(DropIntegrity, 4)
	var added *SA
	statsCopied = func() {
		statsCopied = nil
		b.Account(2, 200) // counted: b is installed when Stats reads it
		a.Account(5, 500)
		if err := db.DeleteSA(0x5200, local); err != nil {
			t.Error(err)
		}
		a.Account(100, 10000) // after its removal: counted nowhere
		added = mustAdd(t, db, testConfig(0x5202, DirIn, 3))
		added.Account(7, 700)
	}
	defer func() { statsCopied = nil }()
	g := db.Stats()
	want := GlobalStats{States: 2, Packets: 15 + 3, Bytes: 1500 + 300}
	want.Drops[DropIntegrity] = 4
	if g != want {
		t.Errorf("Stats() during changes = %+v\nwant                     %+v", g, want)
	}
	g = db.Stats()
	want.Packets, want.Bytes = 15+3+7, 1500+300+700
	if g != want {
		t.Errorf("Stats() after them = %+v\nwant                 %+v", g, want)
	}
}

// TestStatsNeverGoDown: while states carry traffic and are deleted and
// added again, the totals of successive Stats calls never go down (a
// removed state's packets counted after its removal, which the removal
// did not see, must not count in one Stats and be gone from the next).
func TestStatsNeverGoDown(t *testing.T) {
	db, _ := newTestDB(t)
	const n = 64
	for i := range n {
		mustAdd(t, db, testConfig(0x5300+uint32(i), DirIn, 1))
	}
	var stop atomic.Bool
	var churned atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() { // traffic
		for i := 0; !stop.Load(); i++ {
			// Like a batch, it keeps the state it found for a while:
			// some of its packets are counted after the state's removal.
			if s := db.LookupInbound(0x5300 + uint32(i%n)); s != nil {
				for range 100 {
					s.Account(1, 100)
					s.Drop(DropReplay, 1)
				}
			}
		}
	})
	wg.Go(func() { // churn
		for i := 0; !stop.Load(); i++ {
			spi := 0x5300 + uint32(i%n)
			if err := db.DeleteSA(spi, local); err != nil {
				t.Error(err)
				return
			}
			if _, err := db.AddSA(testConfig(spi, DirIn, 1)); err != nil {
				t.Error(err)
				return
			}
			churned.Add(1)
		}
	})
	var last GlobalStats
	for i := 0; i < 2000 || churned.Load() < 2000; i++ {
		g := db.Stats()
		if g.Packets < last.Packets || g.Bytes < last.Bytes || g.Drops[DropReplay] < last.Drops[DropReplay] {
			t.Fatalf("totals went down: %+v after %+v", g, last)
		}
		last = g
	}
	stop.Store(true)
	wg.Wait()
	if last.Packets == 0 {
		t.Error("no traffic was counted")
	}
}
