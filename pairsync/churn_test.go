package pairsync

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/seqstore"
)

// peerStore is a memStore that knows the other node's records
// (PeerRecorder) as seqstore.Store does: ForgetPeer drops the record of
// a key this node never resumed (seqstore retires it, and it expires).
type peerStore struct {
	*memStore
	mu  sync.Mutex
	own map[crypto.Fingerprint]bool
}

func newPeerStore() *peerStore {
	return &peerStore{memStore: newMemStore(), own: map[crypto.Fingerprint]bool{}}
}

func (s *peerStore) Resume(fp crypto.Fingerprint, n bool) (uint64, error) {
	s.mu.Lock()
	s.own[fp] = true
	s.mu.Unlock()
	return s.memStore.Resume(fp, n)
}

func (s *peerStore) ReservePeer(fp crypto.Fingerprint, limit uint64) error {
	return s.memStore.Reserve(fp, limit)
}

func (s *peerStore) ForgetPeer(fp crypto.Fingerprint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.own[fp] {
		s.memStore.mu.Lock()
		delete(s.memStore.high, fp)
		s.memStore.mu.Unlock()
	}
	return nil
}

func (s *peerStore) records() int {
	s.memStore.mu.Lock()
	defer s.memStore.mu.Unlock()
	return len(s.memStore.high)
}

// TestChurn: 10,000 states added, used and deleted through a pair (the
// active reserves and retires each key; the standby records, holds fresh
// and acknowledges them; windows are reported too) leave both nodes'
// maps and the standby's records of the other node's keys where they
// were before: everything kept per key goes with the key.
func TestChurn(t *testing.T) {
	const states, batch = 10000, 500
	var mu sync.Mutex
	live := map[crypto.Fingerprint]bool{}
	bs := newPeerStore()
	p := newFakePair(t, func(a, b *Config) {
		b.Store = bs
		a.Interval, b.Interval = 10*time.Millisecond, 10*time.Millisecond
		a.Lease, b.Lease = 100*time.Millisecond, 100*time.Millisecond
		a.Windows = func() []Window {
			mu.Lock()
			defer mu.Unlock()
			ws := make([]Window, 0, len(live))
			for f := range live {
				ws = append(ws, Window{FP: f, Top: 5, Bitmap: []byte{0x1f}})
			}
			return ws
		}
	})
	keep := crypto.Fingerprint{0xff}
	p.a.SetRole(RoleActive)
	reserveBounded(t, p.a, keep, 1<<20) // one key that stays
	baseline := bs.records()
	for i := 0; i < states; i += batch {
		fps := make([]crypto.Fingerprint, batch)
		limits := make([]uint64, batch)
		for j := range fps {
			fps[j] = crypto.Fingerprint{byte(i >> 8), byte(i), byte(j >> 8), byte(j), 1}
			limits[j] = 1 << 20
			if _, err := p.a.Resume(fps[j], true); err != nil {
				t.Fatal(err)
			}
		}
		mu.Lock()
		for _, f := range fps {
			live[f] = true
		}
		mu.Unlock()
		if err := p.a.ReserveBatch(fps, limits); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the batch's windows reported", func() bool { _, ok := p.b.Window(fps[batch-1]); return ok })
		mu.Lock()
		for _, f := range fps {
			delete(live, f)
		}
		mu.Unlock()
		for _, f := range fps {
			if err := p.a.Retire(f, 1000); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st := p.a.Stats(); st.AckWaits == 0 {
		t.Fatalf("no reservation was acknowledged: %+v", st)
	}
	waitFor(t, "every deleted key forgotten on the standby", func() bool {
		seen, fresh, wfresh, reserved, windows := p.b.Keys()
		return seen == 1 && fresh <= 1 && wfresh == 0 && reserved == 1 && windows == 0 && bs.records() == baseline
	})
	if st := p.b.Stats(); st.Forgotten < states {
		t.Errorf("%d keys forgotten, want %d", st.Forgotten, states)
	}
	p.a.mu.Lock()
	reserved, acked := len(p.a.reserved), len(p.a.acked)
	p.a.mu.Unlock()
	if reserved != 1 || acked > 1 {
		t.Errorf("the active keeps %d reservations and %d acks of its own after the churn, want 1", reserved, acked)
	}
	if v, ok := p.b.Report(keep); !ok || v != 1<<20 {
		t.Errorf("the key that stays: report %d, %v", v, ok)
	}
}

// TestChurnDurable: the same churn with the standby's records in a
// seqstore.Store: once the keys are forgotten and the store's retention
// (one second of its running time here) has run, its log is back to the
// size it had before (between compactions it stays below the store's
// own bound, 4096 records or half again what it keeps).
func TestChurnDurable(t *testing.T) {
	const states, batch = 10000, 1000
	dir := filepath.Join(t.TempDir(), "state")
	st, err := seqstore.Open(dir, seqstore.Options{Retain: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p := newFakePair(t, func(a, b *Config) {
		b.Store = st
		a.Interval, b.Interval = 50*time.Millisecond, 50*time.Millisecond
		a.Lease, b.Lease = time.Second, time.Second
	})
	logSize := func() int64 {
		fi, err := os.Stat(filepath.Join(dir, seqstore.LogName))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	keep := crypto.Fingerprint{0xff}
	p.a.SetRole(RoleActive)
	reserveBounded(t, p.a, keep, 1<<20)
	waitFor(t, "the kept key recorded", func() bool { v, _ := p.b.Ledger().Reserved(keep); return v == 1<<20 })
	before := logSize()
	// A batch the standby does not acknowledge within the lease (a loaded
	// machine) proceeds without it: only acknowledged keys must reach
	// the standby's store.
	acked := 0
	for i := 0; i < states; i += batch {
		fps := make([]crypto.Fingerprint, batch)
		limits := make([]uint64, batch)
		for j := range fps {
			fps[j] = crypto.Fingerprint{byte(i >> 8), byte(i), byte(j >> 8), byte(j), 2}
			limits[j] = 1 << 20
		}
		if err := p.a.ReserveBatch(fps, limits); err != nil {
			t.Fatal(err)
		}
		p.a.mu.Lock()
		for j, f := range fps {
			if p.a.acked[f] >= limits[j] {
				acked++
			}
		}
		p.a.mu.Unlock()
		for _, f := range fps {
			if err := p.a.Retire(f, 1000); err != nil {
				t.Fatal(err)
			}
		}
	}
	if acked == 0 {
		t.Fatalf("the standby acknowledged none of %d keys: %+v", states, p.a.Stats())
	}
	// The link is in order: once the kept key's new limit is recorded,
	// every reservation sent before it has reached the standby.
	reserveBounded(t, p.a, keep, 2<<20)
	waitFor(t, "the kept key's new limit recorded", func() bool { v, _ := p.b.Ledger().Reserved(keep); return v == 2<<20 })
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		seen, fresh, wfresh, reserved, windows := p.b.Keys()
		if seen == 1 && fresh <= 1 && wfresh == 0 && reserved == 1 && windows == 0 && p.b.Stats().Forgotten >= uint64(acked) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("30 s after the churn the standby holds %d keys (%d forgotten, %d acknowledged)", seen, p.b.Stats().Forgotten, acked)
		}
	}
	if grown := logSize(); grown <= before {
		t.Fatalf("the churn did not reach the standby's store: %d keys forgotten, log of %d bytes (%d before)", p.b.Stats().Forgotten, grown, before)
	}
	// The forgotten records expire after a second of the store's running
	// time; the compaction at Open drops them.
	p.a.Close()
	p.b.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Second); ; {
		s, err := seqstore.Open(dir, seqstore.Options{Retain: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		size := logSize()
		if size <= before {
			v, err := s.Resume(keep, true)
			s.Close()
			if err != nil || v != 2<<20 {
				t.Fatalf("the kept key: %d, %v", v, err)
			}
			break
		}
		time.Sleep(1100 * time.Millisecond) // the store's running time, counted in whole seconds
		s.Close()
		if time.Now().After(end) {
			t.Fatalf("the store's log is %d bytes 30 s after the churn (%d before)", size, before)
		}
	}
}
