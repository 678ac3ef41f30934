package seqstore

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
)

// ReserveBatch records every reservation with one write of the log and
// one of the witness, and the values survive a reopen.
func TestReserveBatch(t *testing.T) {
	dir := stateDir(t)
	s := open(t, dir, Options{})
	fps := []crypto.Fingerprint{fp(1), fp(2), fp(3), fp(2)}
	limits := []uint64{1 << 20, 3 << 20, 5 << 20, 4 << 20}
	for _, f := range fps[:3] {
		resume(t, s, f)
	}
	gen, count := s.gen, s.count
	must(t, s.ReserveBatch(fps, limits))
	if s.gen != gen+1 || s.count != count+3 {
		t.Errorf("one batch of 3 keys: witness written %d times, %d records; want 1 and 3", s.gen-gen, s.count-count)
	}
	must(t, s.Close())
	s = open(t, dir, Options{})
	defer s.Close()
	for i, want := range []uint64{1 << 20, 4 << 20, 5 << 20} {
		if v := resume(t, s, fp(i+1)); v != want {
			t.Errorf("key %d: Resume = %d, want %d", i+1, v, want)
		}
	}
	if err := s.ReserveBatch(fps[:1], nil); err == nil {
		t.Error("a batch of 1 key and 0 limits accepted")
	}
}

// A batch torn by a crash beyond the witness (a bad record with whole
// ones after it) is dropped at Open: its call never returned.
func TestReserveBatchTorn(t *testing.T) {
	dir, b := filledDir(t)
	var r [recordSize]byte
	var tail []byte
	(&record{kind: kindReserve, value: 9 << 20, fp: fp(1)}).put(&r)
	tail = append(tail, r[:]...)
	tail = append(tail, make([]byte, recordSize)...) // a sector never written
	(&record{kind: kindReserve, value: 9 << 20, fp: fp(2)}).put(&r)
	tail = append(tail, r[:]...)
	must(t, os.WriteFile(filepath.Join(dir, LogName), append(b, tail...), 0o600))
	s := open(t, dir, Options{})
	defer s.Close()
	for k, want := range map[int]uint64{1: 9 << 20, 2: 1 << 20, 3: 1 << 20} {
		if v := resume(t, s, fp(k)); v != want {
			t.Errorf("key %d: Resume = %d, want %d", k, v, want)
		}
	}
	// The same damage below what the witness acknowledges is refused.
	dir, b = filledDir(t)
	copy(b[2*recordSize:], make([]byte, recordSize))
	must(t, os.WriteFile(filepath.Join(dir, LogName), b, 0o600))
	if s, err := Open(dir, Options{}); err == nil {
		s.Close()
		t.Error("an acknowledged record zeroed: the store opened")
	}
}

// The other node's records: a key this node does not use expires once
// forgotten (ForgetPeer) and Retain has run; one this node uses, or a
// manual one of its own, is kept.
func TestPeerRecordsExpire(t *testing.T) {
	dir := stateDir(t)
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	o := Options{Retain: time.Hour, now: clk.now, minCompact: 1}
	s := open(t, dir, o)
	const peerOnly, ownNegotiated, ownManual, unforgotten = 1, 2, 3, 4
	resumeAs(t, s, fp(ownNegotiated), true)
	resumeAs(t, s, fp(ownManual), false)
	for _, k := range []int{peerOnly, ownNegotiated, ownManual, unforgotten} {
		must(t, s.ReservePeer(fp(k), 5<<20))
	}
	for _, k := range []int{peerOnly, ownNegotiated, ownManual} {
		must(t, s.ForgetPeer(fp(k)))
	}
	clk.add(2 * time.Hour)
	must(t, s.Reserve(fp(9), 1)) // a write: the aged compaction runs
	must(t, s.Close())
	s = open(t, dir, o)
	defer s.Close()
	for k, want := range map[int]bool{peerOnly: false, ownNegotiated: true, ownManual: true, unforgotten: true} {
		if _, ok := s.entries[fp(k)]; ok != want {
			t.Errorf("key %d: kept %v, want %v", k, ok, want)
		}
	}
	if err := s.Inbound(fp(20), true); err != nil {
		t.Fatal(err)
	}
	if err := s.ReservePeer(fp(20), 1); err == nil {
		t.Error("the other node's reservation of a key this node uses inbound accepted")
	}
}
