package pairsync

import (
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
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
