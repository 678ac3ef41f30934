package sa

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/espd/espd/crypto"
)

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
	if !errors.Is(err, ErrKeyReuse) || !strings.Contains(err.Error(), "keep ESN on or use a new key") {
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
	if err := db.Apply(Changes{DeleteSAs: []StateID{{0x5601, local}}, AddSAs: []Config{ci}}); !errors.Is(err, ErrKeyReuse) {
		t.Fatalf("inbound ESN off above 2^32: %v", err)
	}

	// A key cannot change direction.
	co := testConfig(0x5602, DirOut, 1)
	mustAdd(t, db, co)
	co.Dir, co.Src, co.Dst = DirIn, remote, local
	if err := db.Apply(Changes{DeleteSAs: []StateID{{0x5602, remote}}, AddSAs: []Config{co}}); !errors.Is(err, ErrKeyReuse) {
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
