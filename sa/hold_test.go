package sa

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
)

// sealOne encapsulates a small packet with the state's encapsulator at
// sequence number seq and returns the ESP part.
func sealOne(t testing.TB, enc *esp.Encapsulator, seq uint64) []byte {
	t.Helper()
	buf, n := innerPacket(t, flow("198.19.0.1", "198.19.1.1", 17, 1, 2), 40, esp.MaxHeadroom)
	p, err := enc.Encapsulate(buf, esp.MaxHeadroom, n, seq)
	if err != nil {
		t.Fatal(err)
	}
	return buf[p.ESP:p.End]
}

// TestHoldRelease: holds never zero a live state; a deleted state's key
// copies are zeroed at once, its transform by the last Release and not
// before, exactly once; a dead state cannot be held again.
func TestHoldRelease(t *testing.T) {
	db, _ := newTestDB(t)
	watchZero(t)
	c := testConfig(0x2400, DirOut, 1)
	s := mustAdd(t, db, c)
	z := watched(s)
	ref, err := crypto.New(c.Suite, c.EncKey, c.IntegKey)
	if err != nil {
		t.Fatal(err)
	}
	refEnc := *s.Encapsulator()
	refEnc.Transform = ref
	for range 3 {
		if !s.Hold() {
			t.Fatal("Hold of a live state failed")
		}
		s.Release()
	}
	for range 2 { // two holds at once, released below
		if !s.Hold() {
			t.Fatal("Hold of a live state failed")
		}
	}
	if z.zeros.Load() != 0 {
		t.Fatal("a live state's transform was zeroed")
	}
	enc := s.Encapsulator()
	if err := db.DeleteSA(0x2400, remote); err != nil {
		t.Fatal(err)
	}
	if !keysZero(s) {
		t.Error("key copies not zeroed at deletion")
	}
	if s.Hold() {
		t.Fatal("Hold of a deleted state succeeded")
	}
	// The batches that held it still seal with the real key.
	if got, want := sealOne(t, enc, 7), sealOne(t, &refEnc, 7); !bytes.Equal(got, want) {
		t.Fatal("a held transform no longer seals with its key")
	}
	s.Release()
	if z.zeros.Load() != 0 {
		t.Fatal("transform zeroed with a hold left")
	}
	s.Release()
	if n := z.zeros.Load(); n != 1 {
		t.Fatalf("transform zeroed %d times after the last Release, want 1", n)
	}
	if s.Hold() {
		t.Fatal("Hold after the last Release succeeded")
	}
	if z.misuses.Load() != 0 || z.overlaps.Load() != 0 {
		t.Fatalf("transform used after or during Zero: %d, %d", z.misuses.Load(), z.overlaps.Load())
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Release without a hold did not panic")
			}
		}()
		s.Release()
	}()
}

// TestZeroWhenUnheld: a state nobody holds is zeroed at its removal,
// whether deleted, flushed or hard-expired by the data path's own calls;
// a state held across its hard expiry by sequence exhaustion (ReserveSeq
// inside a batch) is zeroed by the Release. An SPI reservation cannot be
// held.
func TestZeroWhenUnheld(t *testing.T) {
	db, _ := newTestDB(t)
	watchZero(t)
	del := mustAdd(t, db, testConfig(0x2500, DirIn, 1))
	db.DeleteSA(0x2500, local)
	flushed := mustAdd(t, db, testConfig(0x2501, DirOut, 2))
	c := testConfig(0x2502, DirOut, 3)
	c.Hard.Packets = 10
	counted := mustAdd(t, db, c)
	counted.Account(10, 1000)
	held := mustAdd(t, db, testConfig(0x2503, DirOut, 4))
	setSeq(held, held.seqMax-2)
	if !held.Hold() {
		t.Fatal("Hold failed")
	}
	if _, g := held.ReserveSeq(5); g != 2 || held.Alive() {
		t.Fatalf("ReserveSeq granted %d, alive %v", g, held.Alive())
	}
	db.FlushSAs()
	for _, s := range []*SA{del, flushed, counted} {
		if s.Alive() || watched(s).zeros.Load() != 1 {
			t.Errorf("%v: zeroed %d times, want 1", s, watched(s).zeros.Load())
		}
	}
	if watched(held).zeros.Load() != 0 {
		t.Fatal("held state zeroed at its expiry")
	}
	held.Release()
	if watched(held).zeros.Load() != 1 {
		t.Fatal("expired state not zeroed by the last Release")
	}
	spi, err := db.AllocSPI(0x3000, 0x3fff)
	if err != nil {
		t.Fatal(err)
	}
	db.sadb.mu.Lock()
	l := db.sadb.larval[spi]
	db.sadb.mu.Unlock()
	if l.Hold() {
		t.Fatal("an SPI reservation was held")
	}
}

// TestHoldWhileDeleting hammers states from data-path goroutines (hold,
// seal or open a batch of packets, release) while the control plane adds,
// deletes, flushes and hard-expires them. Run with -race: no transform is
// used during or after its Zero, every removed state's transform is zeroed
// exactly once when all batches are done, and no live one is.
func TestHoldWhileDeleting(t *testing.T) {
	db, _ := newTestDB(t)
	watchZero(t)
	var (
		mu  sync.Mutex
		all []*SA
	)
	add := func(c Config) {
		if s, err := db.AddSA(c); err == nil {
			mu.Lock()
			all = append(all, s)
			mu.Unlock()
		}
	}
	var stop atomic.Bool
	var batches atomic.Int64
	var wg sync.WaitGroup
	const workers, reqids, batch = 4, 4, 32
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 5))
			buf := make([]byte, 256)
			for i := 0; !stop.Load() && i < 200_000; i++ {
				if r.IntN(2) == 0 {
					s := db.OutboundSA(uint32(r.IntN(reqids)))
					if s == nil || !s.Hold() {
						continue
					}
					enc := s.Encapsulator()
					first, n := s.ReserveSeq(batch)
					for k := range n {
						copy(buf[esp.MaxHeadroom:], innerHdr)
						if _, err := enc.Encapsulate(buf[:esp.MaxHeadroom+len(innerHdr)], esp.MaxHeadroom, len(innerHdr), first+uint64(k)); err != nil {
							t.Error(err)
						}
					}
					s.Release()
					s.Account(uint64(n), uint64(n*len(innerHdr)))
				} else {
					s := db.LookupInbound(0x4000 + uint32(r.IntN(8)))
					if s == nil || !s.Hold() {
						continue
					}
					dec := s.Decapsulator()
					for range batch {
						for j := range 64 {
							buf[j] = byte(r.Uint32())
						}
						dec.Open(buf[:64], 0)
					}
					s.Release()
				}
				batches.Add(1)
			}
		}()
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		runtime.Gosched() // let the workers take holds between changes
		switch k := r.IntN(10); {
		case k < 4:
			c := testConfig(0x5000+uint32(r.IntN(64)), DirOut, uint32(r.IntN(reqids)))
			c.Hard.Packets = uint64(50 + r.IntN(500))
			add(c)
		case k < 7:
			add(testConfig(0x4000+uint32(r.IntN(8)), DirIn, 1))
		case k < 9:
			db.DeleteSA(0x5000+uint32(r.IntN(64)), remote)
			db.DeleteSA(0x4000+uint32(r.IntN(8)), local)
		default:
			if i%50 == 0 {
				db.FlushSAs()
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	if batches.Load() == 0 {
		t.Fatal("the workers never held a state")
	}
	var dead, live int
	for _, s := range all {
		z := watched(s)
		if z.misuses.Load() != 0 || z.overlaps.Load() != 0 {
			t.Errorf("%v: transform used during or after Zero (%d, %d)", s, z.misuses.Load(), z.overlaps.Load())
		}
		want := int32(0)
		if s.State() == StateDead {
			want = 1
			dead++
		} else {
			live++
		}
		if n := z.zeros.Load(); n != want {
			t.Errorf("%v: zeroed %d times, want %d", s, n, want)
		}
		if refs := s.refs.Load() &^ refDead; refs != 0 {
			t.Errorf("%v: %d holds left", s, refs)
		}
	}
	t.Logf("%d batches; %d states removed, %d live", batches.Load(), dead, live)
	if dead == 0 {
		t.Fatal("no state was removed")
	}
}

// innerHdr is a minimal IPv4 packet for the hammering workers.
var innerHdr = []byte{0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 198, 19, 0, 1, 198, 19, 1, 1}
