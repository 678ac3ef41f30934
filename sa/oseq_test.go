package sa

import (
	"errors"
	"sync"
	"testing"

	"github.com/espd/espd/seqstore"
)

// TestSeqFieldValidation: every path gets the same errors, naming the
// field.
func TestSeqFieldValidation(t *testing.T) {
	out := testConfig(0x6000, DirOut, 1)
	in := testConfig(0x6001, DirIn, 1)
	for _, tc := range []struct {
		name  string
		c     Config
		field string
	}{
		{"oseq on an inbound state", func() Config { c := in; c.OSeq = 5; return c }(), FieldOSeq},
		{"replay-seq on an outbound state", func() Config { c := out; c.ReplaySeq = 5; return c }(), FieldReplaySeq},
		{"replay-bitmap on an outbound state", func() Config { c := out; c.ReplayBitmap = []byte{1}; return c }(), FieldReplayBitmap},
		{"oseq 2^32-1 without ESN", func() Config { c := out; c.OSeq = 1<<32 - 1; return c }(), FieldOSeq},
		{"oseq 2^64-1 with ESN", func() Config { c := out; c.Suite = gcm128ESN; c.OSeq = 1<<64 - 1; return c }(), FieldOSeq},
		{"replay-seq 2^32 without ESN", func() Config { c := in; c.ReplaySeq = 1 << 32; return c }(), FieldReplaySeq},
		{"bitmap without replay-seq", func() Config { c := in; c.ReplayBitmap = []byte{1}; return c }(), FieldReplayBitmap},
		{"bitmap longer than the window", func() Config { c := in; c.ReplaySeq = 1000; c.ReplayBitmap = make([]byte, 9); return c }(), FieldReplayBitmap},
		{"bitmap with the window off", func() Config { c := in; c.ReplayWindow = 0; c.ReplaySeq = 1000; c.ReplayBitmap = []byte{0}; return c }(), FieldReplayBitmap},
		{"bit for a number below 1", func() Config { c := in; c.ReplaySeq = 3; c.ReplayBitmap = []byte{0b1000}; return c }(), FieldReplayBitmap},
	} {
		err := tc.c.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want a FieldError for %s", tc.name, err, tc.field)
			continue
		}
		db, _ := newTestDB(t)
		if _, err := db.AddSA(tc.c); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: AddSA: %v", tc.name, err)
		}
	}
	for _, c := range []Config{
		func() Config { c := out; c.OSeq = 1<<32 - 2; return c }(),
		func() Config { c := out; c.Suite = gcm128ESN; c.OSeq = 1<<64 - 2; return c }(),
		func() Config { c := in; c.ReplaySeq = 1<<32 - 1; c.ReplayBitmap = make([]byte, 8); return c }(),
		func() Config {
			c := in
			c.ReplayWindow = 32
			c.ReplaySeq = 3
			c.ReplayBitmap = []byte{0b100, 0, 0, 0, 0, 0, 0, 0}
			return c
		}(),
		func() Config { c := in; c.ReplayWindow = 0; c.ReplaySeq = 3; return c }(),
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("%v: %v", c, err)
		}
	}
}

// TestOSeqFloor: the state sends above the higher of oseq and its key's
// record, and the reservation is durable before the first packet.
func TestOSeqFloor(t *testing.T) {
	for _, tc := range []struct {
		record, oseq, first uint64
	}{
		{0, 0, 1},
		{0, 100, 101},
		{5000, 100, 5001}, // below the record: above the record
		{5000, 9000, 9001},
		{0, 1<<32 - 4, 1<<32 - 3},
	} {
		st := newTestStore()
		c := testConfig(0x6100, DirOut, 1)
		st.high[fpOf(c)] = tc.record
		db := newStoreDB(t, st, 1<<10)
		c.OSeq = tc.oseq
		s := mustAdd(t, db, c)
		if got := s.Stats().SeqOut; got != max(tc.record, tc.oseq) {
			t.Errorf("record %d oseq %d: SeqOut %d before any packet", tc.record, tc.oseq, got)
		}
		if d := st.durable.Load(); d <= tc.first {
			t.Errorf("record %d oseq %d: reservation %d does not cover %d", tc.record, tc.oseq, d, tc.first)
		}
		mustReserve(t, s, 3, tc.first)
		if s.Config().OSeq != 0 {
			t.Error("Config returns the oseq it was given")
		}
	}
}

// TestOSeqESNCrossing numbers across 2^32 from oseq 2^32-3 with ESN.
func TestOSeqESNCrossing(t *testing.T) {
	db, _ := newTestDB(t)
	c := testConfig(0x6200, DirOut, 1)
	c.Suite = gcm128ESN
	c.OSeq = 1<<32 - 3
	s := mustAdd(t, db, c)
	mustReserve(t, s, 5, 1<<32-2)
	if got := s.Stats().SeqOut; got != 1<<32+2 {
		t.Errorf("SeqOut %#x, want %#x", got, uint64(1<<32+2))
	}
}

// TestOSeqRestartNeverRepeats restarts a DB over a real seqstore: the
// state added again with the same oseq continues above what it may have
// sent, after a clean delete and after a crash.
func TestOSeqRestartNeverRepeats(t *testing.T) {
	dir := t.TempDir()
	open := func() (*seqstore.Store, *DB) {
		st, err := seqstore.Open(dir, seqstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return st, newStoreDB(t, st, 1<<10)
	}
	c := testConfig(0x6300, DirOut, 1)
	c.Suite = gcm128ESN
	c.OSeq = 1<<32 - 3
	sent := map[uint64]bool{}
	send := func(s *SA, n int) {
		t.Helper()
		f, g := s.ReserveSeq(n)
		if g != n {
			t.Fatalf("granted %d of %d", g, n)
		}
		for q := f; q < f+uint64(g); q++ {
			if sent[q] {
				t.Fatalf("sequence number %#x sent twice", q)
			}
			sent[q] = true
		}
	}
	st, db := open()
	s := mustAdd(t, db, c)
	send(s, 10)
	// A crash: the store is closed without retiring.
	st.Close()
	st, db = open()
	s = mustAdd(t, db, c)
	send(s, 10)
	// A clean delete and a re-add in a new process.
	if err := db.DeleteSA(s.SPI(), remote); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st, db = open()
	defer st.Close()
	s = mustAdd(t, db, c)
	send(s, 10)
	if !sent[1<<32-2] {
		t.Error("the first state did not start at oseq+1")
	}
}

// TestOSeqReplaceAndUpdate: a state that continues another under its key
// sends above the higher of its oseq and the old state's last number; an
// update raises the counter, never lowers it, with the reservation
// recorded first.
func TestOSeqReplaceAndUpdate(t *testing.T) {
	st := newTestStore()
	db := newStoreDB(t, st, 1<<10)
	c := testConfig(0x6400, DirOut, 1)
	c.Suite = gcm128ESN
	s := mustAdd(t, db, c)
	mustReserve(t, s, 100, 1)
	replace := func(oseq uint64) *SA {
		t.Helper()
		c.OSeq = oseq
		if err := db.Apply(Changes{DeleteSAs: []StateID{{c.SPI, remote}}, AddSAs: []Config{c}}); err != nil {
			t.Fatal(err)
		}
		n, _ := db.GetSA(c.SPI, remote)
		return n
	}
	s = replace(50) // below the old state's 100
	mustReserve(t, s, 1, 101)
	s = replace(1 << 40) // far above its reservation
	if d := st.durable.Load(); d <= 1<<40+1 {
		t.Fatalf("reservation %d below the floor", d)
	}
	mustReserve(t, s, 1, 1<<40+1)

	// Updates.
	u := c
	u.EncKey = nil
	u.OSeq = 1 << 41
	if err := db.UpdateSA(u); err != nil {
		t.Fatal(err)
	}
	if d := st.durable.Load(); d <= 1<<41+1 {
		t.Fatalf("reservation %d below the raised floor", d)
	}
	mustReserve(t, s, 1, 1<<41+1)
	u.OSeq = 7 // lower: ignored
	if err := db.UpdateSA(u); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, 1, 1<<41+2)
	// Within the current reservation: no store call needed.
	u.OSeq = 1<<41 + 10
	if err := db.Apply(Changes{UpdateSAs: []Config{u}}); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, 1, 1<<41+11)
	// The next state of the key, after a delete, continues above.
	if err := db.DeleteSA(c.SPI, remote); err != nil {
		t.Fatal(err)
	}
	c.OSeq = 0
	s = mustAdd(t, db, c)
	mustReserve(t, s, 1, 1<<41+12)
}

// TestReplayStateSet: an inbound state given replay-seq and
// replay-bitmap refuses what they mark, reads them back, merges updates
// and replacements as unions.
func TestReplayStateSet(t *testing.T) {
	db, _ := newTestDB(t)
	c := testConfig(0x6500, DirIn, 1)
	c.Suite = gcm128ESN
	c.ReplaySeq = 1<<32 + 100
	c.ReplayBitmap = []byte{0b0000_0101} // 2^32+100 and 2^32+98 seen, 99 and 93-97 not; the rest of the window seen
	s := mustAdd(t, db, c)
	rw := s.Decapsulator().Replay
	refused := func(q uint64) bool { return rw.Check(q) != nil }
	const b = 1 << 32
	for q, want := range map[uint64]bool{b + 101: false, b + 100: true, b + 99: false, b + 98: true, b + 97: false, b + 93: false, b + 92: true, b + 50: true, 5: true} {
		if refused(q) != want {
			t.Errorf("seq %#x refused %v, want %v", q, refused(q), want)
		}
	}
	if s.ReplayTop() != b+100 {
		t.Errorf("ReplayTop %#x", s.ReplayTop())
	}
	if bm := s.ReplayBitmap(); len(bm) != 8 || bm[0] != 0b0000_0101 || bm[1] != 0xff {
		t.Errorf("ReplayBitmap %x", bm)
	}
	if got := s.Config(); got.ReplaySeq != 0 || got.ReplayBitmap != nil {
		t.Error("Config returns the replay state it was given")
	}
	// An update with a lower top and a bitmap marking 2^32+99: the
	// union; the top stays.
	u := c
	u.EncKey = nil
	u.ReplaySeq = b + 99
	u.ReplayBitmap = []byte{0b0000_0001}
	if err := db.UpdateSA(u); err != nil {
		t.Fatal(err)
	}
	if s.ReplayTop() != b+100 || !refused(b+99) || refused(b+97) {
		t.Errorf("after the update: top %#x, 99 refused %v, 97 refused %v", s.ReplayTop(), refused(b+99), refused(b+97))
	}
	// A replacement under the same key with a higher top: union of the
	// old window and the new state.
	c.ReqID = 2
	c.ReplaySeq = b + 200
	c.ReplayBitmap = []byte{0, 0, 0, 0, 0, 0, 0, 0} // only the top seen, and what the old window refused
	if err := db.Apply(Changes{DeleteSAs: []StateID{{c.SPI, local}}, AddSAs: []Config{c}}); err != nil {
		t.Fatal(err)
	}
	n := db.LookupInbound(c.SPI)
	rw = n.Decapsulator().Replay
	for q, want := range map[uint64]bool{b + 200: true, b + 199: false, b + 150: false, b + 100: true, b + 97: true, b + 136: true, b + 137: false} {
		if refused(q) != want {
			t.Errorf("replaced: seq %#x refused %v, want %v", q, refused(q), want)
		}
	}
}

// TestOSeqRaiseConcurrent raises the floor of a state while goroutines
// take numbers from it: no number is handed out twice, none above the
// store's durable reservation, and the numbers after each raise are above
// its floor.
func TestOSeqRaiseConcurrent(t *testing.T) {
	st := newTestStore()
	db := newStoreDB(t, st, 64)
	c := testConfig(0x6600, DirOut, 1)
	c.Suite = gcm128ESN
	s := mustAdd(t, db, c)
	const workers = 4
	var mu sync.Mutex
	seen := map[uint64]bool{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				f, g := s.ReserveSeq(3)
				d := st.durable.Load()
				mu.Lock()
				for q := f; q < f+uint64(g); q++ {
					if seen[q] {
						t.Errorf("sequence number %d handed out twice", q)
					}
					if q > d {
						t.Errorf("sequence number %d above the durable reservation %d", q, d)
					}
					seen[q] = true
				}
				mu.Unlock()
			}
		}()
	}
	u := c
	u.EncKey = nil
	for i := range uint64(20) {
		u.OSeq = (i + 1) << 20
		if err := db.UpdateSA(u); err != nil {
			t.Fatal(err)
		}
		if got := s.Stats().SeqOut; got < u.OSeq {
			t.Fatalf("SeqOut %d after raising to %d", got, u.OSeq)
		}
	}
	close(stop)
	wg.Wait()
}
