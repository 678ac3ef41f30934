package sa

import (
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
)

// pairBlock is the SeqBlock of the pair tests: small, so that blocks turn
// over often.
const pairBlock = 16

// capStore is a MemSeqStore that remembers the highest reservation of
// every key, to check that nothing is handed out beyond it.
type capStore struct {
	*MemSeqStore
	mu  sync.Mutex
	max map[crypto.Fingerprint]uint64
}

func newCapStore() *capStore {
	return &capStore{MemSeqStore: NewMemSeqStore(), max: map[crypto.Fingerprint]uint64{}}
}

func (c *capStore) Reserve(fp crypto.Fingerprint, limit uint64) error {
	c.mu.Lock()
	c.max[fp] = max(c.max[fp], limit)
	c.mu.Unlock()
	return c.MemSeqStore.Reserve(fp, limit)
}

func (c *capStore) reserved(fp crypto.Fingerprint) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.max[fp]
}

// grant asks s for n numbers until it grants some (an extension may be
// under way) or the state is dead, for 10 s at most.
func grant(t *testing.T, s *SA, n int) (uint64, int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if f, g := s.ReserveSeq(n); g > 0 || s.State() == StateDead {
			return f, g
		}
	}
	t.Fatalf("spi 0x%x granted nothing for 10 s", s.SPI())
	return 0, 0
}

func newPairDB(t *testing.T, node int, st SeqStore) *DB {
	t.Helper()
	return NewDB(Options{Now: newFakeClock().Now, PairNode: node, SeqBlock: pairBlock, Seq: st})
}

// ownerOf returns the node whose block holds n.
func ownerOf(n uint64) int { return int((n-1)/pairBlock%2) + 1 }

// drain takes numbers from s in batches of random sizes, as the data path
// does (asking again once when a grant falls short), until it has taken
// want or nothing comes, and checks each grant: within one block of the
// node's own and within the store's reservation.
func drain(t *testing.T, s *SA, st *capStore, node, want int, rng *rand.Rand) []uint64 {
	t.Helper()
	var got []uint64
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < want && time.Now().Before(deadline) {
		n := 1 + rng.IntN(40)
		f, g := s.ReserveSeq(n)
		if g == 0 {
			time.Sleep(time.Millisecond) // an extension under way
			continue
		}
		last := f + uint64(g) - 1
		if ownerOf(f) != node || ownerOf(last) != node || (f-1)/pairBlock != (last-1)/pairBlock {
			t.Fatalf("node %d was granted %d..%d: not within one block of its own", node, f, last)
		}
		if r := st.reserved(s.fp); last > r {
			t.Fatalf("node %d was granted up to %d, beyond its reservation %d", node, last, r)
		}
		for q := f; q <= last; q++ {
			got = append(got, q)
		}
	}
	if len(got) < want {
		t.Fatalf("node %d got %d numbers, want %d", node, len(got), want)
	}
	return got
}

// TestPairBlocks checks that the two nodes of a pair, using one key at the
// same time (a split brain), never hand out the same number, and that each
// uses its own blocks without a gap.
func TestPairBlocks(t *testing.T) {
	c := testConfig(0x5100, DirOut, 1)
	sts := []*capStore{newCapStore(), newCapStore()}
	var states []*SA
	for i, st := range sts {
		states = append(states, mustAdd(t, newPairDB(t, i+1, st), c))
	}
	const each = 40 * pairBlock
	got := make([][]uint64, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = drain(t, states[i], sts[i], i+1, each, rand.New(rand.NewPCG(uint64(i), 7)))
		}()
	}
	wg.Wait()
	seen := map[uint64]int{}
	for i, l := range got {
		for j, q := range l {
			if o, dup := seen[q]; dup {
				t.Fatalf("number %d handed out by node %d and node %d", q, o, i+1)
			}
			seen[q] = i + 1
			if j > 0 && q != l[j-1]+1 && (q-1)%pairBlock != 0 {
				t.Fatalf("node %d: %d after %d, a gap inside a block", i+1, q, l[j-1])
			}
		}
	}
	if got[0][0] != 1 || got[1][0] != pairBlock+1 {
		t.Errorf("first numbers %d and %d, want 1 and %d", got[0][0], got[1][0], pairBlock+1)
	}
}

// TestPairStandby checks a standby's outbound state: silent until
// Activate, then above the other node's report in a block of its own;
// without a report it stays silent and asks for a rekey.
func TestPairStandby(t *testing.T) {
	st := newCapStore()
	db := newPairDB(t, 2, st)
	sub := db.Subscribe(8)
	db.SetStandby(true)
	if !db.Standby() {
		t.Fatal("Standby() false after SetStandby(true)")
	}
	reported := mustAdd(t, db, testConfig(0x5200, DirOut, 1))
	unknown := mustAdd(t, db, testConfig(0x5201, DirOut, 2))
	in := mustAdd(t, db, testConfig(0x5202, DirIn, 1))
	for _, s := range []*SA{reported, unknown} {
		if _, g := s.ReserveSeq(4); g != 0 || !s.Silent() {
			t.Fatalf("standby state spi 0x%x granted %d numbers (silent %v)", s.SPI(), g, s.Silent())
		}
	}
	if in.Silent() {
		t.Error("an inbound state is silent")
	}
	const floor = 5*pairBlock + 3 // inside node 2's block 5
	acts := db.Activate(func(fp crypto.Fingerprint) (uint64, bool) {
		return floor, fp == reported.fp
	})
	if len(acts) != 2 {
		t.Fatalf("Activate: %d states, want 2", len(acts))
	}
	for _, a := range acts {
		if (a.Err == nil) != (a.SA == reported) {
			t.Errorf("spi 0x%x: %v", a.SA.SPI(), a.Err)
		}
	}
	if db.Standby() {
		t.Error("still standing by after Activate")
	}
	f, g := reported.ReserveSeq(100)
	if f != floor+1 || g != pairBlock-3 {
		t.Errorf("after Activate: granted %d+%d, want %d+%d", f, g, floor+1, pairBlock-3)
	}
	if f, _ := grant(t, reported, 1); f != 7*pairBlock+1 {
		t.Errorf("next block starts at %d, want %d", f, 7*pairBlock+1)
	}
	if r := st.reserved(reported.fp); r < 7*pairBlock+1 {
		t.Errorf("reservation %d below what was granted", r)
	}
	if _, g := unknown.ReserveSeq(4); g != 0 || !unknown.Silent() {
		t.Errorf("unreported state granted %d (silent %v)", g, unknown.Silent())
	}
	ev := nextEvent(t, sub)
	if ev.Kind != EventSoftExpire || ev.SPI != 0x5201 || ev.Reason != ExpireSequence {
		t.Errorf("event %v, want a soft expire of spi 0x5201", ev)
	}
	// A state added after the takeover sends at once.
	fresh := mustAdd(t, db, testConfig(0x5203, DirOut, 3))
	if f, g := grant(t, fresh, 1); g != 1 || ownerOf(f) != 2 {
		t.Errorf("new state after Activate: %d+%d", f, g)
	}
}

// TestPairActivateBelow checks that a report below what the standby's own
// record says is not taken: it continues above the higher.
func TestPairActivateBelow(t *testing.T) {
	st := newCapStore()
	c := testConfig(0x5300, DirOut, 1)
	fp := crypto.KeyFingerprint(c.EncKey, c.IntegKey)
	if err := st.Reserve(fp, 9*pairBlock); err != nil { // an earlier run of this node
		t.Fatal(err)
	}
	db := newPairDB(t, 1, st)
	db.SetStandby(true)
	s := mustAdd(t, db, c)
	db.Activate(func(crypto.Fingerprint) (uint64, bool) { return 3, true })
	if f, _ := grant(t, s, 1); f != 10*pairBlock+1 {
		t.Errorf("first number %d, want %d (node 1's first block above its record)", f, 10*pairBlock+1)
	}
}

// TestPairSeqMax checks that a pair's node stops at the last number its
// blocks allow and expires the state, without a number past 2^32-1.
func TestPairSeqMax(t *testing.T) {
	for node := 1; node <= 2; node++ {
		st := newCapStore()
		db := newPairDB(t, node, st)
		sub := db.Subscribe(8)
		c := testConfig(0x5400+uint32(node), DirOut, 1)
		c.OSeq = 1<<32 - 1 - 3*pairBlock
		s := mustAdd(t, db, c)
		var top uint64
		for range 100 {
			f, g := grant(t, s, 7)
			if g == 0 {
				break
			}
			top = f + uint64(g) - 1
			if ownerOf(f) != node || ownerOf(top) != node {
				t.Fatalf("node %d granted %d..%d", node, f, top)
			}
		}
		if top > 1<<32-1 || s.State() != StateDead {
			t.Fatalf("node %d: last %d, state %v", node, top, s.State())
		}
		if ev := nextEvent(t, sub); ev.Kind != EventHardExpire || ev.Reason != ExpireSequence {
			t.Errorf("node %d: event %v", node, ev)
		}
	}
}

// TestMergeReplay: a pair's reported window is added to an inbound
// state's (the union), and an outbound state ignores one.
func TestMergeReplay(t *testing.T) {
	db := newPairDB(t, 1, newCapStore())
	in := mustAdd(t, db, testConfig(0x5400, DirIn, 1))
	out := mustAdd(t, db, testConfig(0x5401, DirOut, 1))
	if in.Fingerprint() != crypto.KeyFingerprint(testConfig(0x5400, DirIn, 1).EncKey, testConfig(0x5400, DirIn, 1).IntegKey) {
		t.Fatal("Fingerprint is not the keys'")
	}
	in.MergeReplay(100, []byte{0b101}) // 100 and 98 received
	if in.ReplayTop() != 100 {
		t.Fatalf("top %d after the merge, want 100", in.ReplayTop())
	}
	dec := in.Decapsulator()
	for seq, seen := range map[uint64]bool{100: true, 99: false, 98: true, 101: false} {
		if got := dec.Replay.Check(seq) != nil; got != seen {
			t.Errorf("seq %d refused %v, want %v", seq, got, seen)
		}
	}
	in.MergeReplay(50, nil) // below: changes nothing
	if in.ReplayTop() != 100 {
		t.Errorf("an older report moved the top to %d", in.ReplayTop())
	}
	out.MergeReplay(100, nil)
	if out.ReplayTop() != 0 {
		t.Error("an outbound state took a window")
	}
}

// TestPairFollowPeer: a state raised above the other node's report
// reserves nothing until it is used, then continues in this node's first
// own block above the report; a report below changes nothing.
func TestPairFollowPeer(t *testing.T) {
	st := newCapStore()
	db := newPairDB(t, 1, st)
	s := mustAdd(t, db, testConfig(0x5500, DirOut, 1))
	if f, _ := grant(t, s, 3); f != 1 {
		t.Fatalf("first grant at %d", f)
	}
	before := st.reserved(s.fp)
	const floor = 4 * pairBlock // the end of node 2's block 3
	if !db.FollowPeer(s.fp, floor) {
		t.Fatal("FollowPeer raised nothing")
	}
	if db.FollowPeer(s.fp, 2) {
		t.Error("a lower report raised the state")
	}
	if r := st.reserved(s.fp); r != before {
		t.Errorf("FollowPeer reserved %d (was %d) before any use", r, before)
	}
	f, g := grant(t, s, 2)
	if f != floor+1 || g != 2 || ownerOf(f) != 1 {
		t.Errorf("after FollowPeer: granted %d+%d, want %d+2 in node 1's block", f, g, floor+1)
	}
	if r := st.reserved(s.fp); r < floor+2 {
		t.Errorf("reservation %d below what was granted", r)
	}
	if db.FollowPeer(crypto.Fingerprint{1}, 100) {
		t.Error("FollowPeer raised a key without a state")
	}
}

// TestPairLocal: a state whose local address is this node's own
// (Options.PairLocal) numbers as outside a pair, from 1, keeps its key in
// LocalSeq and is never silent; the pair's states beside it are.
func TestPairLocal(t *testing.T) {
	shared, own := newCapStore(), newCapStore()
	sync := netip.MustParseAddr("198.18.3.2")
	db := NewDB(Options{Now: newFakeClock().Now, PairNode: 2, SeqBlock: pairBlock, Seq: shared, LocalSeq: own,
		PairLocal: func(a netip.Addr) bool { return a == sync }})
	db.SetStandby(true)
	lc := testConfig(0x5600, DirOut, 1)
	lc.Src = sync
	l := mustAdd(t, db, lc)
	li := testConfig(0x5601, DirIn, 1)
	li.Dst = sync
	mustAdd(t, db, li)
	p := mustAdd(t, db, testConfig(0x5602, DirOut, 2))
	if l.Silent() || !p.Silent() {
		t.Fatalf("standby: local silent %v, pair's silent %v", l.Silent(), p.Silent())
	}
	if f, g := grant(t, l, 3); f != 1 || g != 3 {
		t.Errorf("local state granted %d+%d, want 1+3 (no pair blocks)", f, g)
	}
	if own.reserved(l.fp) == 0 || shared.reserved(l.fp) != 0 {
		t.Errorf("local key reserved in LocalSeq %d, in Seq %d", own.reserved(l.fp), shared.reserved(l.fp))
	}
	if out, in, _ := own.Used(crypto.KeyFingerprint(li.EncKey, li.IntegKey)); out || !in {
		t.Errorf("local inbound key not recorded in LocalSeq (out %v in %v)", out, in)
	}
	if shared.reserved(p.fp) == 0 || own.reserved(p.fp) != 0 {
		t.Errorf("pair's key reserved in Seq %d, in LocalSeq %d", shared.reserved(p.fp), own.reserved(p.fp))
	}
	if db.FollowPeer(l.fp, 100) {
		t.Error("FollowPeer raised a local state")
	}
}

// TestPairBlockEndESN: the last block of the 64-bit space ends at 2^64-1
// instead of wrapping to 0.
func TestPairBlockEndESN(t *testing.T) {
	db := newPairDB(t, 1, newCapStore())
	for _, c := range []struct{ used, want uint64 }{
		{0, pairBlock}, {pairBlock - 1, pairBlock}, {pairBlock, 2 * pairBlock},
		{1<<64 - pairBlock - 1, 1<<64 - pairBlock}, {1<<64 - pairBlock, 1<<64 - 1}, {1<<64 - 2, 1<<64 - 1},
	} {
		if got := db.pairBlockEnd(c.used); got != c.want {
			t.Errorf("pairBlockEnd(%d) = %d, want %d", c.used, got, c.want)
		}
	}
}
