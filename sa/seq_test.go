package sa

import (
	"sync"
	"testing"
)

func TestReserveSeqBlocks(t *testing.T) {
	db, _ := newTestDB(t)
	s := mustAdd(t, db, testConfig(0x1400, DirOut, 1))
	if f, g := s.ReserveSeq(0); g != 0 || f != 0 {
		t.Errorf("ReserveSeq(0) = %d, %d", f, g)
	}
	if f, g := s.ReserveSeq(64); f != 1 || g != 64 {
		t.Errorf("first block = %d, %d", f, g)
	}
	if f, g := s.ReserveSeq(10); f != 65 || g != 10 {
		t.Errorf("second block = %d, %d", f, g)
	}
	in := mustAdd(t, db, testConfig(0x1401, DirIn, 1))
	if _, g := in.ReserveSeq(10); g != 0 {
		t.Error("an inbound state handed out sequence numbers")
	}
}

// TestReserveSeqConcurrent checks that blocks reserved by many goroutines
// never overlap and leave no gaps.
func TestReserveSeqConcurrent(t *testing.T) {
	db, _ := newTestDB(t)
	s := mustAdd(t, db, testConfig(0x1500, DirOut, 1))
	const workers, rounds = 8, 2000
	got := make([][]uint64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				f, g := s.ReserveSeq(1 + i%7)
				for j := range uint64(g) {
					got[w] = append(got[w], f+j)
				}
			}
		}()
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for _, l := range got {
		for _, q := range l {
			if seen[q] {
				t.Fatalf("sequence number %d handed out twice", q)
			}
			seen[q] = true
		}
	}
	for q := uint64(1); q <= uint64(len(seen)); q++ {
		if !seen[q] {
			t.Fatalf("gap at %d of %d", q, len(seen))
		}
	}
}

// TestReserveSeqExhaustion starts states a few numbers before the end of
// the 32-bit and the 64-bit (ESN) space: they hand out the last ones, then
// die with a hard-expire event and never cycle.
func TestReserveSeqExhaustion(t *testing.T) {
	for _, tc := range []struct {
		esn  bool
		last uint64
	}{{false, 1<<32 - 1}, {true, 1<<64 - 1}} {
		db, _ := newTestDB(t)
		zeroed := watchZero(t)
		sub := db.Subscribe(4)
		c := testConfig(0x1600, DirOut, 3)
		if tc.esn {
			c.Suite = gcm128ESN
		}
		s := mustAdd(t, db, c)
		setSeq(s, tc.last-5) // the seam: five numbers left
		if f, g := s.ReserveSeq(3); f != tc.last-4 || g != 3 {
			t.Fatalf("esn %v: ReserveSeq(3) = %d, %d", tc.esn, f, g)
		}
		noEvent(t, sub)
		if !s.Alive() {
			t.Fatalf("esn %v: dead with numbers left", tc.esn)
		}
		if f, g := s.ReserveSeq(8); f != tc.last-1 || g != 2 {
			t.Fatalf("esn %v: ReserveSeq(8) near the end = %d, %d; want %d, 2", tc.esn, f, g, tc.last-1)
		}
		ev := nextEvent(t, sub)
		if ev.Kind != EventHardExpire || ev.Reason != ExpireSequence || ev.SPI != 0x1600 || ev.ReqID != 3 || ev.Dir != DirOut || ev.Dst != remote {
			t.Fatalf("esn %v: event %v", tc.esn, ev)
		}
		if ev.Reason.String() != "sequence number exhausted" {
			t.Errorf("reason reads %q", ev.Reason)
		}
		if s.Alive() || db.OutboundSA(3) != nil || !zeroed(s) {
			t.Fatalf("esn %v: exhausted state still usable", tc.esn)
		}
		for range 3 {
			if f, g := s.ReserveSeq(1); g != 0 || f != 0 {
				t.Fatalf("esn %v: exhausted state handed out %d", tc.esn, f)
			}
		}
		if st := s.Stats(); st.SeqOut != tc.last {
			t.Errorf("esn %v: SeqOut %d", tc.esn, st.SeqOut)
		}
		noEvent(t, sub)
	}
}
