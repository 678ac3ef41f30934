package gwpair

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/pairsync"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/seqstore"
)

// useSeq hands out n numbers of s (as the data path would, waiting for
// extensions) and returns them as ranges [first, last].
func useSeq(t *testing.T, s *sa.SA, n uint64) [][2]uint64 {
	t.Helper()
	var out [][2]uint64
	end := time.Now().Add(30 * time.Second)
	for n > 0 {
		first, g := s.ReserveSeq(int(min(n, 1<<16)))
		if g == 0 {
			if time.Now().After(end) {
				t.Fatalf("no number handed out within 30 s (%d left)", n)
			}
			time.Sleep(time.Millisecond)
			continue
		}
		out = append(out, [2]uint64{first, first + uint64(g) - 1})
		n -= uint64(g)
	}
	return out
}

// TestPairTakeoverUnderAttack: the active hands out numbers across
// several blocks while the link drops messages of some types (either
// way), then dies; the standby takes over. Whatever was dropped, the new
// active's first number is above every number the old one handed out,
// and no number is handed out twice.
func TestPairTakeoverUnderAttack(t *testing.T) {
	bit := func(ts ...pairsync.Type) uint32 {
		var m uint32
		for _, ty := range ts {
			m |= 1 << ty
		}
		return m
	}
	for _, c := range []struct {
		name     string
		fromA    uint32
		fromB    uint32
		released bool // the takeover can release the state (the reports got through)
	}{
		{"nothing dropped", 0, 0, true},
		{"hellos", 0, bit(pairsync.TypeHello), true},
		{"acks", 0, bit(pairsync.TypeAck), true},
		{"hellos and acks", 0, bit(pairsync.TypeHello, pairsync.TypeAck), true},
		{"own", 0, bit(pairsync.TypeOwn), true},
		{"windows", bit(pairsync.TypeWindows), 0, true},
		{"reserves", bit(pairsync.TypeReserve), 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b, start := newPairNodes(t)
			start()
			a.setRole(t, wire.PairRoleActive)
			out := pairState(t, 0x600, sa.DirOut)
			sa1, sb1 := a.add(t, out), b.add(t, out)
			pairWait(t, "the standby's hello", func() bool { _, ok := a.node.PeerHeard(); return ok })
			a.conn.drop.Store(c.fromA)
			b.conn.drop.Store(c.fromB)
			used := useSeq(t, sa1, 3*sa.DefaultSeqBlock+1000)
			high := used[len(used)-1][1]
			a.conn.cut.Store(true) // the active dies
			st := b.setRole(t, wire.PairRoleActive)
			if !c.released {
				if st.Released != 0 || !sb1.Silent() {
					t.Fatalf("no report reached the standby, yet the takeover released %d", st.Released)
				}
				return
			}
			pairWait(t, "the state released", func() bool {
				if sb1.Silent() {
					b.p.release(b.node.Report, "test", true)
				}
				return !sb1.Silent()
			})
			next := useSeq(t, sb1, 1000)
			if next[0][0] <= high {
				t.Fatalf("the new active starts at %d, the old one handed out up to %d", next[0][0], high)
			}
			seen := map[uint64]bool{}
			for _, r := range append(used, next...) {
				for _, n := range []uint64{r[0], r[1]} {
					if seen[n] {
						t.Fatalf("number %d handed out twice", n)
					}
					seen[n] = true
				}
			}
		})
	}
}

// TestPairSameNodeNumber: two nodes both configured as node 1 refuse each
// other's messages (counted), so neither ever holds a fresh report of the
// other: told to take over, neither releases a state, not even on its own
// record after a restart, and neither hands out a number.
func TestPairSameNodeNumber(t *testing.T) {
	a, b, start := newPairNodesNum(t, 1, 1)
	start()
	out := pairState(t, 0x700, sa.DirOut)
	sa1, sb1 := a.add(t, out), b.add(t, out)
	pairWait(t, "both refusing", func() bool {
		return a.node.Stats().Misconfigured > 0 && b.node.Stats().Misconfigured > 0
	})
	for _, n := range []*pairNode{a, b} {
		if st := n.setRole(t, wire.PairRoleActive); st.Released != 0 || st.Silent != 1 {
			t.Fatalf("takeover: %+v", st)
		}
		n.p.releaseOwn(context.Background(), 0) // as espd restarted active would, after the lease
	}
	for i, s := range []*sa.SA{sa1, sb1} {
		if _, g := s.ReserveSeq(1); g != 0 || !s.Silent() {
			t.Errorf("node %d hands out numbers with a peer of its own number", i+1)
		}
	}
	if a.node.Stats().Received != [6]uint64{} || b.node.Stats().Received != [6]uint64{} {
		t.Error("a message of a node with the same number was taken")
	}
}

// TestPairRetryRelease: a node that takes over before it heard the other
// node (neither was active before) leaves the state silent; once the
// other node, standing by, reports its own reservation, retryRelease
// releases the state above it.
func TestPairRetryRelease(t *testing.T) {
	a, b, start := newPairNodes(t)
	out := pairState(t, 0xa00, sa.DirOut)
	a.add(t, out)
	sb := b.add(t, out)
	if st := b.setRole(t, wire.PairRoleActive); st.Released != 0 || st.Silent != 1 {
		t.Fatalf("takeover without a report: %+v", st)
	}
	start()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go b.p.RetryRelease(ctx, pairTestInterval)
	pairWait(t, "the state released above the other node's own reservation", func() bool { return !sb.Silent() })
	own, _ := b.node.Ledger().Reserved(sb.Fingerprint())
	if first, g := sb.ReserveSeq(1); g != 1 || first <= own || own == 0 {
		t.Fatalf("released: hands out %d (%d), the other node's own reservation %d", first, g, own)
	}
}

// TestPairStaleWindow: with the active's window reports dropped, the
// standby's window of an inbound state goes stale (older than the
// lease): the takeover still merges what it has, counts the state and
// soft-expires it so that it is rekeyed; a state whose window is fresh
// is left alone.
func TestPairStaleWindow(t *testing.T) {
	a, b, start := newPairNodes(t)
	start()
	a.setRole(t, wire.PairRoleActive)
	in := pairState(t, 0x800, sa.DirIn)
	sa1, sb1 := a.add(t, in), b.add(t, in)
	acceptAll(sa1, 100)
	pairWait(t, "a window report", func() bool { return sb1.ReplayTop() == 100 })
	a.conn.drop.Store(1 << pairsync.TypeWindows)
	acceptAll(sa1, 200)
	pairWait(t, "the window report stale", func() bool { _, fresh := b.node.FreshWindow(sb1.Fingerprint()); return !fresh })
	b.setRole(t, wire.PairRoleActive)
	if _, _, stale := b.p.counts(); stale != 1 || sb1.State() != sa.StateSoftExpired {
		t.Fatalf("takeover with a stale window: %d stale, state %v", stale, sb1.State())
	}
	if sb1.ReplayTop() != 100 {
		t.Fatalf("the stale window was not kept: top %d", sb1.ReplayTop())
	}
}

// TestPairStatusDuringTakeover: while a takeover waits on the store, a
// PAIR_ROLE read and a metrics scrape answer, and show the node active.
func TestPairStatusDuringTakeover(t *testing.T) {
	a, b, start := newPairNodes(t)
	start()
	a.setRole(t, wire.PairRoleActive)
	var outs []*sa.SA
	for i := range 5 {
		c := pairState(t, 0x900+uint32(i), sa.DirOut)
		useSeq(t, a.add(t, c), 2*sa.DefaultSeqBlock) // above the standby's own first block
		outs = append(outs, b.add(t, c))
	}
	pairWait(t, "fresh reports", func() bool {
		for _, s := range outs {
			if _, ok := b.node.Report(s.Fingerprint()); !ok {
				return false
			}
		}
		return true
	})
	a.conn.cut.Store(true)
	// Only the takeover's reservations, above every report, wait: a
	// report of the active's still in flight is recorded at or below.
	var top uint64
	for _, s := range outs {
		r, _ := b.node.Report(s.Fingerprint())
		top = max(top, r)
	}
	b.store.above.Store(top)
	block := make(chan struct{})
	b.store.block.Store(&block)
	done := make(chan wire.PairStatus, 1)
	go func() { st, _ := b.p.Role(wire.PairRoleActive); done <- st }()
	pairWait(t, "the takeover waiting on the store", b.store.waiting.Load)
	answered := make(chan string, 2)
	go func() {
		st, err := b.p.Role(wire.PairRoleNone)
		answered <- fmt.Sprintf("status %v %v", st.Role, err)
	}()
	go func() { answered <- scrape(t, b.handler()) }()
	for range 2 {
		select {
		case got := <-answered:
			if !strings.Contains(got, "espd_pair_role 1") && got != fmt.Sprintf("status %v <nil>", wire.PairRoleActive) {
				t.Errorf("answered during the takeover: %.200s", got)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a status request or a scrape waits for the takeover")
		}
	}
	b.store.block.Store(nil)
	close(block)
	if st := <-done; st.Released != uint32(len(outs)) {
		t.Fatalf("takeover released %d of %d", st.Released, len(outs))
	}
}

// unbatched hides a store's ReserveBatch: one write per state.
type unbatched struct{ sa.SeqStore }

// BenchmarkPairTakeover10k measures a takeover of 10,000 outbound states
// (sa.DB.Activate through pairsync.Node on a durable seqstore.Store):
// ns/op is one takeover, batched (ActivateBatch states per write) and,
// for the ratio, one write per state.
func BenchmarkPairTakeover10k(bm *testing.B) {
	bm.Run("batched", func(bm *testing.B) { benchTakeover(bm, true) })
	bm.Run("unbatched", func(bm *testing.B) { benchTakeover(bm, false) })
}

func benchTakeover(bm *testing.B, batched bool) {
	log := slog.New(slog.DiscardHandler)
	st, err := seqstore.Open(bm.TempDir(), seqstore.Options{})
	if err != nil {
		bm.Fatal(err)
	}
	defer st.Close()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		bm.Fatal(err)
	}
	peer, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		bm.Fatal(err)
	}
	defer peer.Close()
	node, err := pairsync.NewNode(pairsync.Config{Key: pairTestKey, Node: 2, Conn: c, Peer: peer.LocalAddr(), Store: st,
		Interval: time.Millisecond, Lease: 5 * time.Millisecond, Logger: log})
	if err != nil {
		bm.Fatal(err)
	}
	defer node.Close()
	var seq sa.SeqStore = node
	if !batched {
		seq = unbatched{node}
	}
	db := sa.NewDB(sa.Options{PairNode: 2, Seq: seq})
	db.SetStandby(true)
	p := &Pair{node: node, num: 2, log: log, db: db}
	for i := range 10000 {
		cfg := pairState(bm, 0x10000+uint32(i), sa.DirOut)
		cfg.EncKey[3], cfg.EncKey[4] = byte(i>>8), byte(i)
		if _, err := db.AddSA(cfg); err != nil {
			bm.Fatal(err)
		}
	}
	var floor uint64
	report := func(crypto.Fingerprint) (uint64, bool) { return floor, true }
	bm.ResetTimer()
	for i := range bm.N {
		bm.StopTimer()
		db.SetStandby(true)
		node.SetRole(pairsync.RoleStandby)
		node.SetRole(pairsync.RoleActive)
		floor = uint64(4*i+2) * sa.DefaultSeqBlock
		bm.StartTimer()
		p.release(report, "takeover", true)
		if _, silent, _ := p.counts(); silent != 0 {
			bm.Fatalf("%d states left silent", silent)
		}
	}
}
