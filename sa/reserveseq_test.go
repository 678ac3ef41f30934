package sa

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestReserveSeqNeverBeyondDurable: with a small block and a store whose
// Reserve blocks, ReserveSeq stops at the durable reservation (and counts
// nothing beyond it); once the store answers, numbering goes on. Every
// number is at or below what the store had recorded when it was handed
// out, from many goroutines.
func TestReserveSeqNeverBeyondDurable(t *testing.T) {
	st := newTestStore()
	st.block = make(chan struct{})
	st.freeCalls = 1 // the first reserve, in AddSA
	db := newStoreDB(t, st, 64)
	s := mustAdd(t, db, testConfig(0x5b00, DirOut, 1))
	total := 0
	for range 100 {
		_, g := s.ReserveSeq(7)
		total += g
	}
	if total != 64 {
		t.Fatalf("handed out %d numbers with 64 reserved and the store blocked", total)
	}
	if st.durable.Load() != 64 {
		t.Fatalf("durable %d", st.durable.Load())
	}
	// Release the store: the extension lands and numbering goes on.
	close(st.block)
	if !pollUntil(func() bool { _, g := s.ReserveSeq(1); return g == 1 }) {
		t.Fatal("numbering did not resume after the store answered")
	}

	// Concurrent users, extensions all the time.
	st2 := newTestStore()
	db2 := newStoreDB(t, st2, 128)
	s2 := mustAdd(t, db2, testConfig(0x5b01, DirOut, 1))
	var wg sync.WaitGroup
	var bad atomic.Uint64
	var handed atomic.Uint64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(2 * time.Second)
			for handed.Load() < 20000 && time.Now().Before(deadline) {
				f, g := s2.ReserveSeq(5)
				if g == 0 {
					runtime.Gosched() // let the extension run
					continue
				}
				if last := f + uint64(g) - 1; last > st2.durable.Load() {
					bad.Store(last)
				}
				handed.Add(uint64(g))
			}
		}()
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("sequence number %d handed out beyond the durable reservation", bad.Load())
	}
	if handed.Load() < 1000 {
		t.Fatalf("only %d numbers in 2 s", handed.Load())
	}
}

// TestReserveSeqStoreFails: a failing extension grants nothing past the
// reservation, is reported and retried; numbering resumes when the store
// recovers.
func TestReserveSeqStoreFails(t *testing.T) {
	st := newTestStore()
	var reported atomic.Int32
	c := newFakeClock()
	db := NewDB(Options{Now: c.Now, Seq: st, SeqBlock: 16, SeqError: func(err error) {
		if strings.Contains(err.Error(), "injected") {
			reported.Add(1)
		}
	}})
	s := mustAdd(t, db, testConfig(0x5c00, DirOut, 1))
	st.set(func() { st.failReserve = errors.New("injected") })
	total := 0
	for range 50 {
		_, g := s.ReserveSeq(3)
		total += g
	}
	if total != 16 {
		t.Fatalf("handed out %d numbers with 16 reserved and the store failing", total)
	}
	if !pollUntil(func() bool { return reported.Load() > 0 }) {
		t.Fatal("store failure not reported")
	}
	st.set(func() { st.failReserve = nil })
	if !pollUntil(func() bool { _, g := s.ReserveSeq(1); return g == 1 }) {
		t.Fatal("numbering did not resume after the store recovered")
	}
}

// TestSealRacesReserve deletes a state while goroutines reserve numbers:
// the retired last number is exactly the highest number handed out, and
// the re-added key continues above it.
func TestSealRacesReserve(t *testing.T) {
	for round := range 20 {
		st := newTestStore()
		db := newStoreDB(t, st, 64)
		c := testConfig(0x5d00, DirOut, 1)
		s := mustAdd(t, db, c)
		var wg sync.WaitGroup
		var maxSeen [4]uint64
		stop := make(chan struct{})
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if f, g := s.ReserveSeq(3); g > 0 {
						maxSeen[w] = max(maxSeen[w], f+uint64(g)-1)
					} else if !s.Alive() {
						return
					}
				}
			}()
		}
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		if err := db.DeleteSA(0x5d00, remote); err != nil {
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
		var m uint64
		for _, v := range maxSeen {
			m = max(m, v)
		}
		_, last, ok := st.get(fpOf(c))
		if !ok || last != m {
			t.Fatalf("round %d: retired at %d, highest handed out %d", round, last, m)
		}
		n := mustAdd(t, db, c)
		if f, _ := n.ReserveSeq(1); f != m+1 {
			t.Fatalf("round %d: re-added key starts at %d, want %d", round, f, m+1)
		}
	}
}

// TestReserveSeqNoAllocs: the data path's ReserveSeq does not allocate,
// across an extension of the reservation too.
func TestReserveSeqNoAllocs(t *testing.T) {
	db := NewDB(Options{})
	s := mustAdd(t, db, testConfig(0x5e00, DirOut, 1))
	if n := testing.AllocsPerRun(10000, func() {
		if _, g := s.ReserveSeq(64); g == 0 {
			t.Fatal("no numbers")
		}
	}); n != 0 {
		t.Errorf("ReserveSeq allocates %v times per call", n)
	}
}
