package pairsync

import (
	"errors"
	"testing"

	"github.com/espd/espd/crypto"
)

// refusingStore refuses the reservations of one key.
type refusingStore struct {
	*memStore
	bad crypto.Fingerprint
}

func (s *refusingStore) Reserve(fp crypto.Fingerprint, limit uint64) error {
	if fp == s.bad {
		return errors.New("test: the store refuses this key")
	}
	return s.memStore.Reserve(fp, limit)
}

// TestRecordRefusedOne: a standby whose store refuses one key's
// reservation records the others, acknowledges them, keeps saying hello,
// and holds that key (only) not fresh; the active uses it on the lease.
func TestRecordRefusedOne(t *testing.T) {
	bs := &refusingStore{memStore: newMemStore(), bad: fp(1)}
	p := newFakePair(t, func(_, b *Config) { b.Store = bs })
	p.a.SetRole(RoleActive)
	reserveBounded(t, p.a, fp(2), 1<<20)
	waitFor(t, "a fresh report", func() bool { _, ok := p.b.Report(fp(2)); return ok })
	before := p.a.Stats()
	hellos := p.b.Stats().Sent[TypeHello]
	if err := p.a.ReserveBatch([]crypto.Fingerprint{fp(1), fp(2), fp(3)}, []uint64{1 << 20, 3 << 20, 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if st := p.a.Stats(); st.LeaseWaits != before.LeaseWaits+1 {
		t.Fatalf("the batch with a refused key: %d lease waits, want 1", st.LeaseWaits-before.LeaseWaits)
	}
	p.a.mu.Lock()
	acked2, acked3, acked1 := p.a.acked[fp(2)], p.a.acked[fp(3)], p.a.acked[fp(1)]
	p.a.mu.Unlock()
	if acked2 != 3<<20 || acked3 != 1<<20 || acked1 != 0 {
		t.Fatalf("acknowledged: key 1 %d, key 2 %d, key 3 %d; want 0, %d, %d", acked1, acked2, acked3, 3<<20, 1<<20)
	}
	if _, ok := p.b.Report(fp(1)); ok {
		t.Fatal("the refused key is fresh")
	}
	if st := p.b.Stats(); st.RecordErrors == 0 || st.Sent[TypeHello] <= hellos {
		t.Fatalf("standby: %d record errors, hellos %d then %d", st.RecordErrors, hellos, st.Sent[TypeHello])
	}
	waitFor(t, "the others fresh", func() bool {
		v2, ok2 := p.b.Report(fp(2))
		v3, ok3 := p.b.Report(fp(3))
		return ok2 && ok3 && v2 == 3<<20 && v3 == 1<<20
	})
}

// TestActiveOwnFresh: an active holds the standby's own reservations
// fresh (they echo its run's stamps), so that a state it left silent is
// released above them; a standby's Own before this run's stamps is not.
func TestActiveOwnFresh(t *testing.T) {
	p := newFakePair(t)
	p.a.SetRole(RoleActive)
	if _, ok := p.a.Report(fp(8)); ok {
		t.Fatal("fresh before any report")
	}
	if _, err := p.b.Resume(fp(8), true); err != nil {
		t.Fatal(err)
	}
	reserveBounded(t, p.b, fp(8), 2<<20)
	waitFor(t, "the standby's own reservation fresh on the active", func() bool {
		v, ok := p.a.Report(fp(8))
		return ok && v == 2<<20
	})
}
