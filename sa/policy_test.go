package sa

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/espd/espd/packet"
)

func TestAddPolicyIndexAndDuplicate(t *testing.T) {
	db := NewDB(Options{})
	p := Policy{Selector: Selector{Src: pfx("198.18.0.0/24"), Dst: pfx("198.19.0.0/24")}, Dir: DirOut, ReqID: 7}
	got, err := db.AddPolicy(p)
	if err != nil {
		t.Fatal(err)
	}
	if got.Index == 0 || got.Index%8 != uint32(DirOut) {
		t.Errorf("index %d: want nonzero with direction %d in the low bits", got.Index, DirOut)
	}
	// Same selector with host bits set is the same selector.
	dup := p
	dup.Src = pfx("198.18.0.5/24")
	dup.Priority = 5
	_, err = db.AddPolicy(dup)
	if !errors.Is(err, ErrPolicyExists) {
		t.Fatalf("duplicate AddPolicy: err = %v, want ErrPolicyExists", err)
	}
	t.Logf("duplicate refused: %v", err)
	// Other direction is not a duplicate.
	in := p
	in.Dir = DirIn
	gotIn, err := db.AddPolicy(in)
	if err != nil {
		t.Fatal(err)
	}
	if gotIn.Index == got.Index || gotIn.Index%8 != uint32(DirIn) {
		t.Errorf("inbound index %d", gotIn.Index)
	}
	// UpdatePolicy replaces, keeping the index.
	upd := dup
	upd.Action = ActionDrop
	u, err := db.UpdatePolicy(upd)
	if err != nil {
		t.Fatal(err)
	}
	if u.Index != got.Index {
		t.Errorf("UpdatePolicy changed the index from %d to %d", got.Index, u.Index)
	}
	if u.Src != pfx("198.18.0.0/24") {
		t.Errorf("UpdatePolicy kept host bits: %v", u.Src)
	}
	lp, ok := db.LookupPolicy(0, DirOut, flow("198.18.0.1", "198.19.0.1", 6, 1, 2))
	if !ok || lp.Action != ActionDrop || lp.Priority != 5 {
		t.Errorf("after update lookup = %v, %v", lp, ok)
	}
	if n := len(db.Policies()); n != 2 {
		t.Errorf("%d policies, want 2", n)
	}
	if err := db.DeletePolicy(PolicyID{Selector: p.Selector, Dir: DirOut}); err != nil {
		t.Fatal(err)
	}
	if err := db.DeletePolicy(PolicyID{Selector: p.Selector, Dir: DirOut}); !errors.Is(err, ErrNotFound) {
		t.Errorf("second delete: %v, want ErrNotFound", err)
	}
	if _, ok := db.LookupPolicy(0, DirOut, flow("198.18.0.1", "198.19.0.1", 6, 1, 2)); ok {
		t.Error("deleted policy still found")
	}
	if _, ok := db.GetPolicy(PolicyID{Selector: in.Selector, Dir: DirIn}); !ok {
		t.Error("GetPolicy lost the inbound policy")
	}
	db.FlushPolicies()
	if len(db.Policies()) != 0 {
		t.Error("FlushPolicies left policies")
	}
	if _, ok := db.LookupPolicy(0, DirIn, flow("198.18.0.1", "198.19.0.1", 6, 1, 2)); ok {
		t.Error("flushed policy still found")
	}
	if _, err := db.AddPolicy(p); err != nil {
		t.Errorf("re-adding after flush: %v", err)
	}
}

func TestPolicyValidate(t *testing.T) {
	db := NewDB(Options{})
	bad := []Policy{
		{Dir: 3},
		{Action: 9},
		{Selector: Selector{Src: pfx("198.18.0.0/24"), Dst: pfx("2001:db8::/32")}},
		{TmplSrc: netip.MustParseAddr("198.18.0.1"), TmplDst: netip.MustParseAddr("2001:db8::1")},
	}
	for _, p := range bad {
		if _, err := db.AddPolicy(p); err == nil {
			t.Errorf("AddPolicy(%v) accepted it", p)
		}
	}
}

func TestLookupPolicyOrder(t *testing.T) {
	db := NewDB(Options{})
	add := func(p Policy) Policy {
		t.Helper()
		p.Dir = DirOut
		got, err := db.AddPolicy(p)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	f := flow("198.18.0.10", "198.19.0.10", 6, 5555, 443)
	wide := add(Policy{Priority: 10})
	if got, _ := db.LookupPolicy(0, DirOut, f); got.Index != wide.Index {
		t.Fatalf("got %v, want the only policy", got)
	}
	narrow := add(Policy{Selector: Selector{Src: pfx("198.18.0.0/24"), Dst: pfx("198.19.0.0/24")}, Priority: 10})
	if got, _ := db.LookupPolicy(0, DirOut, f); got.Index != narrow.Index {
		t.Fatalf("equal priority: got %v, want the more specific %v", got, narrow)
	}
	proto := add(Policy{Selector: Selector{Src: pfx("198.18.0.0/24"), Dst: pfx("198.19.0.0/24"), Proto: 6}, Priority: 10})
	if got, _ := db.LookupPolicy(0, DirOut, f); got.Index != proto.Index {
		t.Fatalf("got %v, want the one naming the protocol %v", got, proto)
	}
	port := add(Policy{Selector: Selector{Src: pfx("198.18.0.0/24"), Dst: pfx("198.19.0.0/24"), Proto: 6, DstPorts: PortRange{443, 443}}, Priority: 10})
	if got, _ := db.LookupPolicy(0, DirOut, f); got.Index != port.Index {
		t.Fatalf("got %v, want the one naming the port %v", got, port)
	}
	urgent := add(Policy{Selector: Selector{Dst: pfx("198.19.0.0/16")}, Priority: 1, Action: ActionBypass})
	if got, _ := db.LookupPolicy(0, DirOut, f); got.Index != urgent.Index {
		t.Fatalf("got %v, want the lower priority value %v", got, urgent)
	}
	// Equal priority and specificity: the older one.
	older := add(Policy{Selector: Selector{Dst: pfx("198.19.0.0/16"), Proto: 17}, Priority: 1})
	add(Policy{Selector: Selector{Dst: pfx("198.19.0.0/16"), Proto: 17, DstPorts: PortRange{1, 2}}, Priority: 0}) // does not match
	newer := add(Policy{Selector: Selector{Src: pfx("198.18.0.0/16"), Proto: 17}, Priority: 1})
	if got, _ := db.LookupPolicy(0, DirOut, flow("198.18.0.10", "198.19.0.10", 17, 5555, 443)); got.Index != older.Index {
		t.Fatalf("got %v, want the older %v (not %v)", got, older, newer)
	}
	if _, ok := db.LookupPolicy(0, DirIn, f); ok {
		t.Error("inbound lookup found an outbound policy")
	}
	if _, ok := db.LookupPolicy(0, Direction(7), f); ok {
		t.Error("lookup in a bad direction found something")
	}
}

// linearLookup is the reference LookupPolicy: a scan for the best rank.
func linearLookup(ps []*policyEntry, dir Direction, f packet.Flow) (Policy, bool) {
	var best *policyEntry
	for _, e := range ps {
		if e.Dir == dir && e.Match(f) && (best == nil || e.rank.less(best.rank)) {
			best = e
		}
	}
	if best == nil {
		return Policy{}, false
	}
	return best.Policy, true
}

// randAddr returns an address near a few bases, so that random prefixes
// and flows often overlap.
func randAddr(r *rand.Rand, v6 bool) netip.Addr {
	if v6 {
		b := netip.MustParseAddr("2001:db8::").As16()
		b[5] = byte(r.IntN(3))
		b[15] = byte(r.IntN(4))
		if r.IntN(3) == 0 {
			b[8] = byte(r.IntN(256))
		}
		return netip.AddrFrom16(b)
	}
	b := [4]byte{198, 18 + byte(r.IntN(2)), byte(r.IntN(3)), byte(r.IntN(8))}
	return netip.AddrFrom4(b)
}

func randPrefix(r *rand.Rand, v6 bool) netip.Prefix {
	if r.IntN(6) == 0 {
		return netip.Prefix{}
	}
	a := randAddr(r, v6)
	bits := r.IntN(a.BitLen() + 1)
	if r.IntN(2) == 0 { // favour common lengths
		bits = []int{0, 8, 16, 24, 32, 48, 64, 128}[r.IntN(8)]
		bits = min(bits, a.BitLen())
	}
	return netip.PrefixFrom(a, bits)
}

func randPorts(r *rand.Rand) PortRange {
	switch r.IntN(4) {
	case 0:
		lo := uint16(r.IntN(8))
		return PortRange{lo, lo + uint16(r.IntN(4))}
	case 1:
		p := uint16(r.IntN(8))
		return PortRange{p, p}
	}
	return PortRange{}
}

func randPolicy(r *rand.Rand) Policy {
	v6 := r.IntN(2) == 0
	p := Policy{
		Selector: Selector{Src: randPrefix(r, v6), Dst: randPrefix(r, v6)},
		Dir:      Direction(r.IntN(int(numDirections))),
		Action:   Action(r.IntN(int(numActions))),
		Priority: uint32(r.IntN(4)),
		ReqID:    uint32(r.IntN(100)),
	}
	if r.IntN(2) == 0 {
		p.Proto = []uint8{1, 6, 17, 58}[r.IntN(4)]
	}
	p.SrcPorts, p.DstPorts = randPorts(r), randPorts(r)
	return p
}

func randFlow(r *rand.Rand) packet.Flow {
	v6 := r.IntN(2) == 0
	f := packet.Flow{Src: randAddr(r, v6), Dst: randAddr(r, v6), Proto: []uint8{1, 6, 17, 58, 47}[r.IntN(5)],
		SrcPort: uint16(r.IntN(10)), DstPort: uint16(r.IntN(10))}
	if r.IntN(50) == 0 { // mixed families: only family-less selectors can match
		f.Dst = randAddr(r, !v6)
	}
	return f
}

// TestLookupPolicyMatchesLinear is the property test: with random IPv4 and
// IPv6 policies added, updated and deleted, tuple space search gives the
// same answer as a linear scan for random flows.
func TestLookupPolicyMatchesLinear(t *testing.T) {
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 99))
		db := NewDB(Options{})
		checked, hits := 0, 0
		for round := range 60 {
			dels := 2 // of 10 operations
			if round%3 == 2 {
				dels = 7 // let tuples shrink and bounds go stale
			}
			for range 1 + r.IntN(40) {
				p := randPolicy(r)
				var err error
				switch op := r.IntN(10); {
				case op == 0:
					_, err = db.UpdatePolicy(p)
				case op <= dels:
					if ps := db.Policies(); len(ps) > 0 {
						v := ps[r.IntN(len(ps))]
						err = db.DeletePolicy(v.ID())
					}
				default:
					_, err = db.AddPolicy(p)
					if errors.Is(err, ErrPolicyExists) {
						err = nil
					}
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if round == 30 && seed%2 == 0 {
				db.FlushPolicies()
			}
			entries := db.entriesForTest()
			for range 150 {
				f := randFlow(r)
				dir := Direction(r.IntN(int(numDirections)))
				got, gok := db.LookupPolicy(0, dir, f)
				want, wok := linearLookup(entries, dir, f)
				if gok != wok || got != want {
					t.Fatalf("seed %d round %d: LookupPolicy(%v, %+v) = %v, %v; linear = %v, %v",
						seed, round, dir, f, got, gok, want, wok)
				}
				checked++
				if gok {
					hits++
				}
			}
		}
		if hits < checked/10 || hits == checked {
			t.Fatalf("seed %d: %d of %d lookups matched: the test does not exercise both outcomes", seed, hits, checked)
		}
	}
}

// entriesForTest returns the installed policy entries.
func (db *DB) entriesForTest() []*policyEntry {
	s := &db.spdb
	s.mu.Lock()
	defer s.mu.Unlock()
	es := make([]*policyEntry, 0, len(s.byID))
	for _, e := range s.byID {
		es = append(es, e)
	}
	return es
}

func TestLookupPolicyNoAlloc(t *testing.T) {
	db := NewDB(Options{})
	r := rand.New(rand.NewPCG(5, 5))
	for range 500 {
		db.AddPolicy(randPolicy(r))
	}
	flows := make([]packet.Flow, 64)
	for i := range flows {
		flows[i] = randFlow(r)
	}
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		db.LookupPolicy(0, DirOut, flows[i%len(flows)])
		i++
	}); n != 0 {
		t.Errorf("LookupPolicy allocates %v times per call", n)
	}
}
