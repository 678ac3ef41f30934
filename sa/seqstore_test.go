package sa

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
)

// testStore is a SeqStore that records its calls and can be told to fail
// or to block.
type testStore struct {
	mu      sync.Mutex
	high    map[crypto.Fingerprint]uint64 // what a file would hold
	retired map[crypto.Fingerprint]uint64 // last Retire per key
	inbound map[crypto.Fingerprint]int    // inbound states per key
	calls   []string

	failResume, failReserve, failRetire error
	// block, if set, makes Reserve wait for a value from it (after the
	// first unblocked reserves have gone through).
	block     chan struct{}
	freeCalls int
	// durable is the highest limit any Reserve has recorded, published
	// before Reserve returns.
	durable atomic.Uint64
}

func newTestStore() *testStore {
	return &testStore{high: map[crypto.Fingerprint]uint64{}, retired: map[crypto.Fingerprint]uint64{}}
}

func (m *testStore) log(format string, args ...any) {
	m.calls = append(m.calls, fmt.Sprintf(format, args...))
}

func (m *testStore) Resume(fp crypto.Fingerprint, negotiated bool) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if negotiated {
		m.log("resume negotiated")
	} else {
		m.log("resume")
	}
	if m.failResume != nil {
		return 0, m.failResume
	}
	return m.high[fp], nil
}

func (m *testStore) Reserve(fp crypto.Fingerprint, limit uint64) error {
	m.mu.Lock()
	blk := m.block
	if blk != nil && m.freeCalls > 0 {
		m.freeCalls--
		blk = nil
	}
	m.mu.Unlock()
	if blk != nil {
		<-blk
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.log("reserve %d", limit)
	if m.failReserve != nil {
		return m.failReserve
	}
	// A file store records the value given: it may go down, which the DB
	// must never let happen below what a live state may use.
	m.high[fp] = limit
	if limit > m.durable.Load() {
		m.durable.Store(limit)
	}
	return nil
}

func (m *testStore) Retire(fp crypto.Fingerprint, last uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.log("retire %d", last)
	if m.failRetire != nil {
		return m.failRetire
	}
	m.high[fp] = last
	m.retired[fp] = last
	return nil
}

func (m *testStore) Inbound(fp crypto.Fingerprint, negotiated bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.log("inbound")
	if m.inbound == nil {
		m.inbound = map[crypto.Fingerprint]int{}
	}
	m.inbound[fp]++
	return nil
}

func (m *testStore) RetireInbound(fp crypto.Fingerprint) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.log("retire inbound")
	m.inbound[fp]--
	return nil
}

func (m *testStore) Used(fp crypto.Fingerprint) (out, in bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, in = m.inbound[fp]
	_, out = m.high[fp]
	return out, in, nil
}

func (m *testStore) get(fp crypto.Fingerprint) (high, retired uint64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.retired[fp]
	return m.high[fp], r, ok
}

func (m *testStore) set(f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f()
}

func newStoreDB(t testing.TB, st SeqStore, block uint64) *DB {
	t.Helper()
	c := newFakeClock()
	return NewDB(Options{Now: c.Now, Seq: st, SeqBlock: block})
}

func fpOf(c Config) crypto.Fingerprint { return crypto.KeyFingerprint(c.EncKey, c.IntegKey) }

func mustReserve(t *testing.T, s *SA, n int, wantFirst uint64) {
	t.Helper()
	if f, g := s.ReserveSeq(n); f != wantFirst || g != n {
		t.Fatalf("ReserveSeq(%d) = %d, %d; want %d, %d", n, f, g, wantFirst, n)
	}
}

// TestSeqResumeAfterCrash: the store holds a reservation and no
// retirement, as a crash leaves it; a state added with that key starts
// above the reservation, not at 1.
func TestSeqResumeAfterCrash(t *testing.T) {
	st := newTestStore()
	c := testConfig(0x5000, DirOut, 1)
	st.high[fpOf(c)] = 3 << 20
	db := newStoreDB(t, st, 1<<10)
	s := mustAdd(t, db, c)
	mustReserve(t, s, 5, 3<<20+1)
	if high, _, _ := st.get(fpOf(c)); high != 3<<20+1<<10 {
		t.Errorf("reservation %d, want one block above the record", high)
	}
	// Another key is unaffected.
	o := mustAdd(t, db, testConfig(0x5001, DirOut, 1))
	mustReserve(t, o, 1, 1)
}

// TestSeqCrashMidTransfer simulates a SIGKILL in the middle of a transfer:
// whatever the state had sent, the record in the store is above it, and a
// restarted DB continues above that.
func TestSeqCrashMidTransfer(t *testing.T) {
	st := newTestStore()
	c := testConfig(0x5010, DirOut, 1)
	db := newStoreDB(t, st, 256)
	s := mustAdd(t, db, c)
	var sent uint64
	for range 100 {
		f, g := s.ReserveSeq(17)
		if g == 0 {
			time.Sleep(time.Millisecond) // waiting for an extension
			continue
		}
		sent = f + uint64(g) - 1
	}
	// "Crash": the DB is dropped without DeleteSA or FlushSAs.
	high, _, retired := st.get(fpOf(c))
	if retired || high < sent {
		t.Fatalf("store record %d (retired %v) below the %d numbers sent", high, retired, sent)
	}
	db2 := newStoreDB(t, st, 256)
	s2 := mustAdd(t, db2, c)
	if f, _ := s2.ReserveSeq(1); f <= sent {
		t.Fatalf("after the restart the key restarted at %d, at or below %d already sent", f, sent)
	}
}

// TestSeqReAddContinues: a key re-added after DeleteSA, FlushSAs or a
// hard expiry continues exactly above its last number, in the same DB
// and, through the store, after a clean restart.
func TestSeqReAddContinues(t *testing.T) {
	st := newTestStore()
	db := newStoreDB(t, st, 0)
	c := testConfig(0x5100, DirOut, 1)
	s := mustAdd(t, db, c)
	mustReserve(t, s, 41, 1)
	if err := db.DeleteSA(0x5100, remote); err != nil {
		t.Fatal(err)
	}
	if _, last, ok := st.get(fpOf(c)); !ok || last != 41 {
		t.Fatalf("retired at %d (%v), want 41", last, ok)
	}
	if got := s.Stats().SeqOut; got != 41 {
		t.Errorf("deleted state's SeqOut %d, want 41", got)
	}
	s = mustAdd(t, db, c)
	mustReserve(t, s, 1, 42)
	db.FlushSAs()
	if _, last, _ := st.get(fpOf(c)); last != 42 {
		t.Fatalf("flush retired at %d, want 42", last)
	}
	// A clean restart: a new DB on the same store.
	db = newStoreDB(t, st, 0)
	s = mustAdd(t, db, c)
	mustReserve(t, s, 1, 43)

	// Through the in-memory default store too.
	mem := NewDB(Options{})
	s = mustAdd(t, mem, c)
	mustReserve(t, s, 7, 1)
	if err := mem.DeleteSA(0x5100, remote); err != nil {
		t.Fatal(err)
	}
	s = mustAdd(t, mem, c)
	mustReserve(t, s, 1, 8)
}

// TestSeqRetireAfterExpiry: a state removed by the data path (sequence
// exhaustion) or the lifetime ticker is retired from a goroutine with its
// exact last number, and a re-add while that is pending continues above
// it without the pending retire undoing the new reservation.
func TestSeqRetireAfterExpiry(t *testing.T) {
	st := newTestStore()
	db := newStoreDB(t, st, 0)
	c := testConfig(0x5200, DirOut, 1)
	c.Hard.Packets = 10
	s := mustAdd(t, db, c)
	mustReserve(t, s, 30, 1)
	s.Account(10, 1000) // hard expiry
	if s.Alive() {
		t.Fatal("state did not expire")
	}
	if !pollUntil(func() bool { _, last, ok := st.get(fpOf(c)); return ok && last == 30 }) {
		t.Fatalf("expired state not retired at 30: %v", st.calls)
	}

	// Pending retire taken over: hold keying so that the retire waits.
	c2 := testConfig(0x5201, DirOut, 2)
	s2 := mustAdd(t, db, c2)
	mustReserve(t, s2, 5, 1)
	db.keying.Lock()
	db.hardExpire(s2, ExpireBytes)
	db.keying.Unlock()
	s3 := mustAdd(t, db, c2) // may run before or after the retire
	mustReserve(t, s3, 1, 6)
	time.Sleep(20 * time.Millisecond)
	db.sadb.mu.Lock()
	e := db.sadb.keys[fpOf(c2)]
	db.sadb.mu.Unlock()
	if e == nil || e.live != s3 || e.retiring != nil {
		t.Fatalf("key record after the take-over: %+v", e)
	}
	if high, _, _ := st.get(fpOf(c2)); high < 6 {
		t.Fatalf("the old state's retire lowered the record below the new state's use: %d", high)
	}
}

func pollUntil(cond func() bool) bool {
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// TestSeqStoreFailureRefusesState: when the store cannot say what the key
// has used, or cannot record a reservation, AddSA refuses the state with
// an error that says why, and installs nothing.
func TestSeqStoreFailureRefusesState(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*testStore)
		want string
	}{
		{"resume", func(s *testStore) { s.failResume = errors.New("disk on fire") }, "cannot know which sequence numbers key"},
		{"reserve", func(s *testStore) { s.failReserve = errors.New("disk full") }, "cannot reserve sequence numbers for key"},
	} {
		st := newTestStore()
		tc.set(st)
		db := newStoreDB(t, st, 0)
		_, err := db.AddSA(testConfig(0x5300, DirOut, 1))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "disk") {
			t.Errorf("%s failure: AddSA error %v", tc.name, err)
		}
		if len(db.SAs()) != 0 {
			t.Errorf("%s failure installed a state", tc.name)
		}
		// Inbound states need nothing from the store.
		mustAdd(t, db, testConfig(0x5301, DirIn, 1))
	}
	// A key that has used its whole space.
	st := newTestStore()
	c := testConfig(0x5302, DirOut, 1)
	st.high[fpOf(c)] = 1<<32 - 1
	db := newStoreDB(t, st, 0)
	if _, err := db.AddSA(c); !errors.Is(err, ErrKeyExhausted) {
		t.Errorf("exhausted key: %v", err)
	}
	c.Suite = gcm128ESN // with ESN it goes on
	s := mustAdd(t, db, c)
	mustReserve(t, s, 1, 1<<32)
}

// TestDuplicateKeyRefused: a key that a live state has is refused for any
// other state, in every combination of directions; once that state is
// gone, the key may be used again.
func TestDuplicateKeyRefused(t *testing.T) {
	for _, dirs := range [][2]Direction{{DirOut, DirOut}, {DirIn, DirOut}, {DirOut, DirIn}, {DirIn, DirIn}} {
		db, _ := newTestDB(t)
		a := testConfig(0x5400, dirs[0], 1)
		first := mustAdd(t, db, a)
		b := testConfig(0x5401, dirs[1], 2)
		b.EncKey = a.EncKey
		_, err := db.AddSA(b)
		want := fmt.Sprintf("key already in use by state spi 0x00005400 dir %v; every SA needs its own key", dirs[0])
		if !errors.Is(err, ErrKeyReuse) || !strings.Contains(err.Error(), want) {
			t.Errorf("%v then %v: %v", dirs[0], dirs[1], err)
		}
		if len(db.SAs()) != 1 {
			t.Errorf("%v then %v: refused state installed", dirs[0], dirs[1])
		}
		// Apply refuses two new states with one key as well.
		c1, c2 := testConfig(0x5402, DirOut, 3), testConfig(0x5403, dirs[1], 3)
		c2.EncKey = c1.EncKey
		if err := db.Apply(Changes{AddSAs: []Config{c1, c2}}); !errors.Is(err, ErrKeyReuse) {
			t.Errorf("Apply with one key twice: %v", err)
		}
		if err := db.DeleteSA(first.SPI(), first.Config().Dst); err != nil {
			t.Fatal(err)
		}
		// After the first state went, its key serves its direction
		// again, never the other one (one key, one direction, for ever).
		_, err = db.AddSA(b)
		if dirs[0] == dirs[1] && err != nil {
			t.Errorf("%v then %v: key refused after the first state went: %v", dirs[0], dirs[1], err)
		}
		want = fmt.Sprintf("dir %v: key %s was used dir %v before", dirs[1], fpString(fpOf(a)), dirs[0])
		if dirs[0] != dirs[1] && (!errors.Is(err, ErrKeyDirection) || !strings.Contains(err.Error(), want)) {
			t.Errorf("%v then %v after the first state went: %v, want ErrKeyDirection saying %q", dirs[0], dirs[1], err, want)
		}
	}
	// Options.Loopback lets exactly an inbound twin with the same SPI in.
	db := NewDB(Options{Loopback: true})
	out := testConfig(0x5410, DirOut, 1)
	mustAdd(t, db, out)
	in := testConfig(0x5410, DirIn, 1)
	in.EncKey = out.EncKey
	mustAdd(t, db, in)
	other := testConfig(0x5411, DirOut, 1)
	other.EncKey = out.EncKey
	if _, err := db.AddSA(other); err == nil {
		t.Error("loopback DB let a second outbound state have the key")
	}
}

// TestStateKeepsNoKeyCopy: a state remembers its key's fingerprint, not
// the key: it has no byte slice outside its transform, and UpdateSA tells
// the same key from another by the fingerprint.
func TestStateKeepsNoKeyCopy(t *testing.T) {
	typ := reflect.TypeOf(SA{})
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Uint8 {
			t.Errorf("SA.%s is a byte slice: a state must keep no copy of its keys", f.Name)
		}
	}
	db, _ := newTestDB(t)
	c := testConfig(0x5f00, DirOut, 1)
	s := mustAdd(t, db, c)
	if s.fp != fpOf(c) {
		t.Error("state's fingerprint is not its key's")
	}
	c.TTL = 9
	if err := db.UpdateSA(c); err != nil { // the same key: no change
		t.Fatal(err)
	}
	c.EncKey = testStateKey(len(c.EncKey), 0x5f01, DirOut)
	if err := db.UpdateSA(c); !isField(err, ErrImmutable, FieldKeys) {
		t.Errorf("UpdateSA with another key: %v", err)
	}
}

// TestSeqOriginReachesStore: Config.Negotiated is what the store's Resume
// is told, the state's configuration keeps it, UpdateSA cannot change it,
// and a manual state cannot continue a negotiated one under its key.
func TestSeqOriginReachesStore(t *testing.T) {
	st := newTestStore()
	db := newStoreDB(t, st, 1<<10)
	man := testConfig(0x5600, DirOut, 1)
	neg := testConfig(0x5601, DirOut, 2)
	neg.Negotiated = true
	mustAdd(t, db, man)
	s := mustAdd(t, db, neg)
	st.mu.Lock()
	var resumes []string
	for _, c := range st.calls {
		if strings.HasPrefix(c, "resume") {
			resumes = append(resumes, c)
		}
	}
	st.mu.Unlock()
	if want := []string{"resume", "resume negotiated"}; !reflect.DeepEqual(resumes, want) {
		t.Errorf("Resume calls %q, want %q", resumes, want)
	}
	if !s.Config().Negotiated || !strings.Contains(s.Config().String(), " negotiated") {
		t.Errorf("negotiated state's configuration %v", s.Config())
	}
	if m, _ := db.GetSA(0x5600, remote); m.Config().Negotiated || strings.Contains(m.Config().String(), "negotiated") {
		t.Errorf("manual state's configuration %v", m.Config())
	}
	if DefaultConfig().Negotiated {
		t.Error("DefaultConfig is negotiated: manual keying must be the default")
	}

	up := s.Config()
	up.Negotiated = false
	if err := db.UpdateSA(up); !isField(err, ErrImmutable, FieldNegotiated) {
		t.Errorf("UpdateSA turning a negotiated state manual: %v, want an error", err)
	}
	up = s.Config()
	up.TTL = 9
	if err := db.UpdateSA(up); err != nil {
		t.Errorf("UpdateSA keeping Negotiated: %v", err)
	}

	// The same key, now by hand: refused, and the negotiated state stays.
	again := neg
	again.Negotiated = false
	err := db.Apply(Changes{DeleteSAs: []StateID{{0x5601, remote}}, AddSAs: []Config{again}})
	if !isField(err, ErrKeyReuse, FieldNegotiated) {
		t.Errorf("manual state continuing a negotiated key: %v, want an error", err)
	}
	if !s.Alive() {
		t.Error("refused change removed the negotiated state")
	}
	// Negotiated again is fine.
	if err := db.Apply(Changes{DeleteSAs: []StateID{{0x5601, remote}}, AddSAs: []Config{neg}}); err != nil {
		t.Errorf("negotiated state continuing a negotiated key: %v", err)
	}
}
