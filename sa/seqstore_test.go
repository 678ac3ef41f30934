package sa

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
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
	if _, err := db.AddSA(c); err == nil || !strings.Contains(err.Error(), "used every sequence number") {
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
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v then %v: %v", dirs[0], dirs[1], err)
		}
		if len(db.SAs()) != 1 {
			t.Errorf("%v then %v: refused state installed", dirs[0], dirs[1])
		}
		// Apply refuses two new states with one key as well.
		c1, c2 := testConfig(0x5402, DirOut, 3), testConfig(0x5403, dirs[1], 3)
		c2.EncKey = c1.EncKey
		if err := db.Apply(Changes{AddSAs: []Config{c1, c2}}); err == nil || !strings.Contains(err.Error(), "key already in use") {
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

// TestApplySuiteChangeContinues replaces an outbound state with one of
// the same key and another suite (ESN on, a 12-byte ICV), reqid or
// destination options: the new state numbers its packets above the old
// one's, the store is neither told to retire the key nor lowered, and
// lookups by the new reqid find it.
func TestApplySuiteChangeContinues(t *testing.T) {
	st := newTestStore()
	db := newStoreDB(t, st, 1<<10)
	c := testConfig(0x5500, DirOut, 1)
	s := mustAdd(t, db, c)
	mustReserve(t, s, 100, 1)
	next := uint64(101)
	gcm12 := crypto.Suite{Encryption: crypto.EncrAESGCM12, KeyBits: 128}
	for _, change := range []func(*Config){
		func(c *Config) { c.Suite = gcm128ESN },
		func(c *Config) { c.Suite = gcm12 },
		func(c *Config) { c.ReqID = 9 },
		func(c *Config) { c.Suite = gcm128 },
	} {
		change(&c)
		err := db.Apply(Changes{DeleteSAs: []StateID{{0x5500, remote}}, AddSAs: []Config{c}})
		if err != nil {
			t.Fatal(err)
		}
		if s.Alive() {
			t.Fatal("replaced state still alive")
		}
		if got := s.Stats().SeqOut; got != next-1 {
			t.Errorf("replaced state's SeqOut %d, want %d", got, next-1)
		}
		n, ok := db.GetSA(0x5500, remote)
		if !ok || n == s || n.Suite() != c.Suite || n.ReqID() != c.ReqID {
			t.Fatalf("new state %v", n)
		}
		mustReserve(t, n, 10, next)
		next += 10
		s = n
	}
	if db.OutboundSA(9) != s || db.OutboundSA(1) != nil {
		t.Error("OutboundSA does not find the state under its reqid")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	resumes := 0
	for _, call := range st.calls {
		if call == "resume" {
			resumes++
		}
		if strings.HasPrefix(call, "retire") {
			t.Errorf("store calls %v: a replacement retired the key", st.calls)
		}
	}
	if resumes != 1 {
		t.Errorf("store calls %v: a replacement must continue the old state, not resume from the store", st.calls)
	}
}

// TestApplyESNOffRefused: turning ESN off under a key that may have gone
// past 2^32-1 is refused rather than restarting the counter.
func TestApplyESNOffRefused(t *testing.T) {
	db, _ := newTestDB(t)
	c := testConfig(0x5600, DirOut, 1)
	c.Suite = gcm128ESN
	s := mustAdd(t, db, c)
	setSeq(s, 1<<32+5)
	c.Suite = gcm128
	err := db.Apply(Changes{DeleteSAs: []StateID{{0x5600, remote}}, AddSAs: []Config{c}})
	if err == nil || !strings.Contains(err.Error(), "keep ESN on or use a new key") {
		t.Fatalf("ESN off above 2^32: %v", err)
	}
	if !s.Alive() || len(db.SAs()) != 1 {
		t.Fatal("refused change removed the state")
	}
	mustReserve(t, s, 1, 1<<32+6)

	// Inbound: the peer has gone past 2^32.
	ci := testConfig(0x5601, DirIn, 1)
	ci.Suite = gcm128ESN
	in := mustAdd(t, db, ci)
	if err := in.Decapsulator().Replay.Update(1<<32 + 3); err != nil {
		t.Fatal(err)
	}
	ci.Suite = gcm128
	if err := db.Apply(Changes{DeleteSAs: []StateID{{0x5601, local}}, AddSAs: []Config{ci}}); err == nil || !strings.Contains(err.Error(), "keep ESN on") {
		t.Fatalf("inbound ESN off above 2^32: %v", err)
	}

	// A key cannot change direction.
	co := testConfig(0x5602, DirOut, 1)
	mustAdd(t, db, co)
	co.Dir, co.Src, co.Dst = DirIn, remote, local
	if err := db.Apply(Changes{DeleteSAs: []StateID{{0x5602, remote}}, AddSAs: []Config{co}}); err == nil || !strings.Contains(err.Error(), "cannot change direction") {
		t.Fatalf("direction change under one key: %v", err)
	}
}

// TestApplyInboundKeepsReplay replaces an inbound state under the same key
// with the same window, a larger one, a smaller one, and with ESN on: the
// new state refuses every number the old one would have refused.
func TestApplyInboundKeepsReplay(t *testing.T) {
	db, _ := newTestDB(t)
	c := testConfig(0x5700, DirIn, 1)
	c.ReplayWindow = 64
	s := mustAdd(t, db, c)
	rw := s.Decapsulator().Replay
	for _, q := range []uint64{200, 190, 150} {
		if err := rw.Update(q); err != nil {
			t.Fatal(err)
		}
	}
	check := func(n *SA, what string) {
		t.Helper()
		w := n.Decapsulator().Replay
		if w.Top() != 200 || n.ReplayTop() != 200 {
			t.Errorf("%s: top %d, want 200", what, w.Top())
		}
		// Old window 64 over top 200: 137-200 tracked, 136 and below
		// refused.
		for _, q := range []uint64{200, 190, 150, 136, 100, 1} {
			if w.Check(q) == nil {
				t.Errorf("%s: %d accepted", what, q)
			}
		}
		for _, q := range []uint64{199, 160, 137, 201, 1000} {
			if err := w.Check(q); err != nil {
				t.Errorf("%s: %d refused: %v", what, q, err)
			}
		}
	}
	for _, tc := range []struct {
		what   string
		change func(*Config)
		same   bool
	}{
		{"same window, reqid change", func(c *Config) { c.ReqID = 5 }, true},
		{"larger window", func(c *Config) { c.ReplayWindow = 256 }, false},
		{"ESN on", func(c *Config) { c.Suite = gcm128ESN }, false},
		{"smaller window", func(c *Config) { c.ReplayWindow = 64; c.Suite = gcm128 }, false},
	} {
		tc.change(&c)
		if err := db.Apply(Changes{DeleteSAs: []StateID{{0x5700, local}}, AddSAs: []Config{c}}); err != nil {
			t.Fatalf("%s: %v", tc.what, err)
		}
		n := db.LookupInbound(0x5700)
		if n == nil || n == s {
			t.Fatalf("%s: not replaced", tc.what)
		}
		if tc.same && n.Decapsulator().Replay != s.Decapsulator().Replay {
			t.Errorf("%s: window not kept", tc.what)
		}
		check(n, tc.what)
		s = n
	}
}

// snapshot describes everything Apply may change, to compare before and
// after a refused Apply.
func snapshot(db *DB) string {
	var b strings.Builder
	for _, s := range db.SAs() {
		st := s.Stats()
		fmt.Fprintf(&b, "%p %v seq %d top %d\n", s, s, st.SeqOut, s.ReplayTop())
	}
	for _, p := range db.Policies() {
		fmt.Fprintf(&b, "policy %d %v\n", p.Index, p)
	}
	db.sadb.mu.Lock()
	fmt.Fprintf(&b, "keys %d larval %d\n", len(db.sadb.keys), len(db.sadb.larval))
	db.sadb.mu.Unlock()
	return b.String()
}

// TestApplyAllOrNothing makes each step of a reload-sized Apply fail in
// turn and checks that nothing changed; then the good change applies
// whole.
func TestApplyAllOrNothing(t *testing.T) {
	st := newTestStore()
	db := newStoreDB(t, st, 0)
	outA := testConfig(0x5800, DirOut, 1)
	inA := testConfig(0x5801, DirIn, 1)
	outB := testConfig(0x5802, DirOut, 2)
	oldA := mustAdd(t, db, outA)
	mustAdd(t, db, inA)
	mustAdd(t, db, outB)
	mustReserve(t, oldA, 10, 1)
	polA := Policy{Selector: Selector{Dst: pfx("198.19.1.0/24")}, Dir: DirOut, ReqID: 1}
	polB := Policy{Selector: Selector{Dst: pfx("198.19.2.0/24")}, Dir: DirOut, ReqID: 2}
	for _, p := range []Policy{polA, polB} {
		if _, err := db.AddPolicy(p); err != nil {
			t.Fatal(err)
		}
	}
	ctl := mustAdd(t, db, testConfig(0x5900, DirIn, 7)) // someone else's state

	good := func() Changes {
		newA := outA
		newA.Suite = gcm128ESN // same key: continues
		newA.ReqID = 3
		upd := inA
		upd.EncKey = nil
		upd.ECN = true
		fresh := testConfig(0x5803, DirOut, 4) // new key: store
		polA2 := polA
		polA2.ReqID = 3
		polC := Policy{Selector: Selector{Dst: pfx("198.19.3.0/24")}, Dir: DirOut, ReqID: 4}
		return Changes{
			DeleteSAs:      []StateID{{0x5800, remote}, {0x5802, remote}},
			AddSAs:         []Config{newA, fresh},
			UpdateSAs:      []Config{upd},
			DeletePolicies: []PolicyID{{Selector: polB.Selector, Dir: DirOut}},
			Policies:       []Policy{polA2, polC},
		}
	}
	before := snapshot(db)
	failTransform := func() func() {
		orig := newTransform
		n := 0
		newTransform = func(s crypto.Suite, ek, ik []byte) (crypto.Transform, error) {
			if n++; n == 2 {
				return nil, errors.New("injected transform failure")
			}
			return orig(s, ek, ik)
		}
		return func() { newTransform = orig }
	}
	for _, tc := range []struct {
		name  string
		bad   func(*Changes)
		setup func() func()
	}{
		{"invalid state", func(c *Changes) { c.AddSAs[1].EncKey = c.AddSAs[1].EncKey[:3] }, nil},
		{"invalid update", func(c *Changes) { c.UpdateSAs[0].DSCP = 99 }, nil},
		{"invalid policy", func(c *Changes) { c.Policies[1].Dir = 9 }, nil},
		{"transform", nil, failTransform},
		{"SPI clash", func(c *Changes) {
			c.AddSAs[1].SPI, c.AddSAs[1].Dir, c.AddSAs[1].Dst, c.AddSAs[1].Src = 0x5900, DirIn, local, remote
		}, nil},
		{"state exists", func(c *Changes) { c.AddSAs[1].SPI = 0x5801; c.AddSAs[1].Dst = local }, nil},
		{"key clash", func(c *Changes) { c.AddSAs[1].EncKey = testConfig(0x5900, DirIn, 7).EncKey }, nil},
		{"update target missing", func(c *Changes) { c.UpdateSAs[0].SPI = 0x5899 }, nil},
		{"update changes keys", func(c *Changes) { c.UpdateSAs[0].EncKey = testConfig(0x5898, DirIn, 1).EncKey }, nil},
		{"policy twice", func(c *Changes) { c.Policies = append(c.Policies, c.Policies[0]) }, nil},
		{"store resume", nil, func() func() {
			st.set(func() { st.failResume = errors.New("injected resume failure") })
			return func() { st.set(func() { st.failResume = nil }) }
		}},
		{"store reserve", nil, func() func() {
			st.set(func() { st.failReserve = errors.New("injected reserve failure") })
			return func() { st.set(func() { st.failReserve = nil }) }
		}},
	} {
		ch := good()
		if tc.bad != nil {
			tc.bad(&ch)
		}
		var undo func()
		if tc.setup != nil {
			undo = tc.setup()
		}
		err := db.Apply(ch)
		if undo != nil {
			undo()
		}
		if err == nil {
			t.Fatalf("%s: Apply succeeded", tc.name)
		}
		t.Logf("%s: %v", tc.name, err)
		if after := snapshot(db); after != before {
			t.Fatalf("%s: a refused Apply changed the database:\nbefore:\n%s\nafter:\n%s", tc.name, before, after)
		}
		if !oldA.Alive() || !ctl.Alive() {
			t.Fatalf("%s: a refused Apply removed a state", tc.name)
		}
	}
	mustReserve(t, oldA, 1, 11)

	if err := db.Apply(good()); err != nil {
		t.Fatal(err)
	}
	if oldA.Alive() {
		t.Error("replaced state alive")
	}
	newA, ok := db.GetSA(0x5800, remote)
	if !ok || newA.ReqID() != 3 || db.OutboundSA(3) != newA {
		t.Fatalf("reqid change not applied: %v", newA)
	}
	mustReserve(t, newA, 1, 12)
	if _, ok := db.GetSA(0x5802, remote); ok {
		t.Error("deleted state still there")
	}
	fresh, _ := db.GetSA(0x5803, remote)
	mustReserve(t, fresh, 1, 1)
	if in := db.LookupInbound(0x5801); in == nil || !in.Config().ECN {
		t.Error("update not applied")
	}
	if p, ok := db.LookupPolicy(0, DirOut, flow("198.18.0.1", "198.19.1.1", 6, 1, 2)); !ok || p.ReqID != 3 {
		t.Errorf("policy A after Apply: %v", p)
	}
	if _, ok := db.LookupPolicy(0, DirOut, flow("198.18.0.1", "198.19.2.1", 6, 1, 2)); ok {
		t.Error("deleted policy B still matches")
	}
	if p, ok := db.LookupPolicy(0, DirOut, flow("198.18.0.1", "198.19.3.1", 6, 1, 2)); !ok || p.ReqID != 4 {
		t.Errorf("new policy C: %v", p)
	}
	if !ctl.Alive() {
		t.Error("Apply touched a state it was not given")
	}
}

// TestApplyChainedMoves moves a state onto the destination of a state
// the same Apply deletes.
func TestApplyChainedMoves(t *testing.T) {
	db, _ := newTestDB(t)
	a := testConfig(0x5a00, DirOut, 1)
	mustAdd(t, db, a)
	b := testConfig(0x5a00, DirOut, 1)
	b.Dst = local
	b.EncKey = testStateKey(len(b.EncKey), 0x5aff, DirOut)
	sb := mustAdd(t, db, b)
	// Move a onto b's destination while b is deleted.
	a.Dst = local
	a.EncKey = nil
	if err := db.Apply(Changes{DeleteSAs: []StateID{{0x5a00, local}}, UpdateSAs: []Config{a}}); err != nil {
		t.Fatal(err)
	}
	if s, ok := db.GetSA(0x5a00, local); !ok || s == sb {
		t.Errorf("moved state not found at its new destination")
	}
	if _, ok := db.GetSA(0x5a00, remote); ok {
		t.Error("moved state still at its old destination")
	}
}

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
	if err := db.UpdateSA(c); err == nil || !strings.Contains(err.Error(), "cannot change the keys") {
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
	if err := db.UpdateSA(up); err == nil || !strings.Contains(err.Error(), "negotiated") {
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
	if err == nil || !strings.Contains(err.Error(), "negotiated by IKE") {
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
