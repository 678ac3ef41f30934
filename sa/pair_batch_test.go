package sa

import (
	"errors"
	"sync"
	"testing"

	"github.com/espd/espd/crypto"
)

// batchStore is a capStore that is a SeqBatcher, counting its batches,
// and refuses them all when fail is set.
type batchStore struct {
	*capStore
	mu      sync.Mutex
	batches []int
	fail    bool
}

func (b *batchStore) ReserveBatch(fps []crypto.Fingerprint, limits []uint64) error {
	b.mu.Lock()
	b.batches = append(b.batches, len(fps))
	fail := b.fail
	b.mu.Unlock()
	if fail {
		return errors.New("test: the store refuses the batch")
	}
	for i, fp := range fps {
		if err := b.capStore.Reserve(fp, limits[i]); err != nil {
			return err
		}
	}
	return nil
}

// TestPairActivateBatches: a takeover of more states than ActivateBatch
// reserves them with one store write per batch, and every state continues
// above the report within a reservation of the store, in a block of its
// node; a batch the store refuses leaves its states silent, with the
// error.
func TestPairActivateBatches(t *testing.T) {
	for _, fail := range []bool{false, true} {
		st := &batchStore{capStore: newCapStore(), fail: fail}
		db := newPairDB(t, 2, st)
		db.SetStandby(true)
		n := 2*ActivateBatch + 5
		states := make([]*SA, n)
		for i := range states {
			states[i] = mustAdd(t, db, testConfig(0x60000+uint32(i), DirOut, uint32(i+1)))
		}
		const floor = 9 * pairBlock
		acts := db.Activate(func(crypto.Fingerprint) (uint64, bool) { return floor, true })
		if len(acts) != n {
			t.Fatalf("Activate: %d states, want %d", len(acts), n)
		}
		st.mu.Lock()
		batches := st.batches
		st.mu.Unlock()
		if len(batches) != 3 || batches[0] != ActivateBatch || batches[2] != 5 {
			t.Fatalf("fail %v: batches of %v, want %d, %d and 5", fail, batches, ActivateBatch, ActivateBatch)
		}
		for _, a := range acts {
			s := a.SA
			if fail {
				if a.Err == nil || !s.Silent() {
					t.Fatalf("a refused batch: spi 0x%x released (err %v)", s.SPI(), a.Err)
				}
				continue
			}
			if a.Err != nil || a.Floor != floor {
				t.Fatalf("spi 0x%x: floor %d, %v", s.SPI(), a.Floor, a.Err)
			}
			f, g := s.ReserveSeq(1)
			if g != 1 || f <= floor || ownerOf(f) != 2 || f > st.reserved(s.fp) {
				t.Fatalf("spi 0x%x hands out %d (%d) above %d, reserved %d", s.SPI(), f, g, floor, st.reserved(s.fp))
			}
		}
	}
}
