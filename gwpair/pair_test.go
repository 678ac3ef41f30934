package gwpair

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/pairsync"
	"github.com/espd/espd/sa"
)

// pairConn is a pair link's socket whose sends a test drops (cut) or
// fails.
type pairConn struct {
	net.PacketConn
	cut, fail atomic.Bool
	drop      atomic.Uint32 // bit t set: messages of pairsync.Type t are dropped
}

var errPairSend = errors.New("test: send refused")

func (c *pairConn) WriteTo(b []byte, a net.Addr) (int, error) {
	if c.fail.Load() {
		return 0, errPairSend
	}
	if c.cut.Load() || (len(b) > 5 && b[5] < 32 && c.drop.Load()&(1<<b[5]) != 0) {
		return len(b), nil
	}
	return c.PacketConn.WriteTo(b, a)
}

// pairStore is a node's sequence-number store whose Reserve a test makes
// fail.
type pairStore struct {
	*sa.MemSeqStore
	fail    atomic.Bool
	block   atomic.Pointer[chan struct{}] // Reserve waits until it is closed
	above   atomic.Uint64                 // only a Reserve beyond this limit waits
	waiting atomic.Bool                   // a Reserve waits on block
}

func (s *pairStore) Reserve(fp crypto.Fingerprint, limit uint64) error {
	if ch := s.block.Load(); ch != nil && limit > s.above.Load() {
		s.waiting.Store(true)
		<-*ch
	}
	if s.fail.Load() {
		return errors.New("test: store refuses")
	}
	return s.MemSeqStore.Reserve(fp, limit)
}

// pairNode is one node of a test pair: its DB and Pair, wired as the
// daemon and New wire them.
type pairNode struct {
	p     *Pair
	db    *sa.DB
	node  *pairsync.Node
	conn  *pairConn
	store *pairStore
}

const (
	pairTestInterval = 40 * time.Millisecond
	pairTestLease    = 400 * time.Millisecond
)

var pairTestKey = pairsync.Key{0x70, 0x61, 0x69, 0x72}

// newPairNodes returns nodes 1 and 2 of a pair on loopback UDP, both
// standing by; start runs them until the test ends.
func newPairNodes(t *testing.T) (a, b *pairNode, start func()) {
	t.Helper()
	return newPairNodesNum(t, 1, 2)
}

// newPairNodesNum is newPairNodes with the nodes numbered n1 and n2.
func newPairNodesNum(t *testing.T, n1, n2 int) (a, b *pairNode, start func()) {
	t.Helper()
	ca, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cb, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		ca.Close()
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	mk := func(num int, c, peer net.PacketConn) *pairNode {
		n := &pairNode{conn: &pairConn{PacketConn: c}, store: &pairStore{MemSeqStore: sa.NewMemSeqStore()}}
		node, err := pairsync.NewNode(pairsync.Config{
			Key: pairTestKey, Node: num, Conn: n.conn, Peer: peer.LocalAddr(), Store: n.store,
			Interval: pairTestInterval, Lease: pairTestLease, Logger: log,
			Windows:   func() []pairsync.Window { return pairWindows(n.db) },
			OnWindows: func(ws []pairsync.Window) { mergeWindows(n.db, ws) },
		})
		if err != nil {
			t.Fatal(err)
		}
		n.node = node
		n.db = sa.NewDB(sa.Options{PairNode: num, Seq: node})
		n.db.SetStandby(true)
		n.p = &Pair{node: node, num: num, log: log, db: n.db}
		return n
	}
	a, b = mk(n1, ca, cb), mk(n2, cb, ca)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		a.node.Close()
		b.node.Close()
		wg.Wait()
	})
	start = func() {
		for _, n := range []*pairNode{a, b} {
			wg.Add(1)
			go func() { defer wg.Done(); n.node.Run(ctx) }()
		}
	}
	return a, b, start
}

// setRole is PAIR_ROLE on n; the reply must say role.
func (n *pairNode) setRole(t *testing.T, role wire.PairRole) wire.PairStatus {
	t.Helper()
	st, err := n.p.Role(role)
	if err != nil {
		t.Fatal(err)
	}
	if st.Role != role {
		t.Fatalf("PAIR_ROLE %v: the node reports role %v", role, st.Role)
	}
	return st
}

// pairWait polls cond for up to 10 s.
func pairWait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("not within 10 s: %s", what)
		}
	}
}

var (
	pairLocal  = netip.MustParseAddr("198.18.0.1")
	pairRemote = netip.MustParseAddr("198.18.0.2")
)

// pairState is the Config of a state both nodes install (a pair shares
// its states); inbound ones have a window of 2048, so that every number
// the tests send stays inside it and only the reported bitmap refuses it.
func pairState(t testing.TB, spi uint32, dir sa.Direction) sa.Config {
	t.Helper()
	suite, err := crypto.ParseSuite("aes128gcm16")
	if err != nil {
		t.Fatal(err)
	}
	c := sa.Config{SPI: spi, Dir: dir, ReqID: 1, Src: pairLocal, Dst: pairRemote, Suite: suite, EncKey: bytes.Repeat([]byte{0x5a}, suite.EncKeyLen())}
	for i := range c.EncKey {
		c.EncKey[i] = byte(i)
	}
	c.EncKey[0], c.EncKey[1], c.EncKey[2] = byte(spi>>8), byte(spi), byte(dir)
	if dir == sa.DirIn {
		c.Src, c.Dst, c.ReplayWindow = pairRemote, pairLocal, 2048
	}
	return c
}

func (n *pairNode) add(t *testing.T, c sa.Config) *sa.SA {
	t.Helper()
	s, err := n.db.AddSA(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// accept takes packet seq on s as the data path does (Check before
// decryption, Update once authentic) and reports whether s accepted it.
func accept(s *sa.SA, seq uint64) bool {
	r := s.Decapsulator().Replay
	return r.Check(seq) == nil && r.Update(seq) == nil
}

// acceptAll offers 1..last to s and returns what it accepted.
func acceptAll(s *sa.SA, last uint64) []uint64 {
	var got []uint64
	for seq := uint64(1); seq <= last; seq++ {
		if accept(s, seq) {
			got = append(got, seq)
		}
	}
	return got
}

// ranges writes seqs (ascending) as ranges: "1..3 7".
func ranges(seqs []uint64) string {
	var b strings.Builder
	for i := 0; i < len(seqs); {
		j := i
		for j+1 < len(seqs) && seqs[j+1] == seqs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		if j > i {
			fmt.Fprintf(&b, "%d..%d", seqs[i], seqs[j])
		} else {
			fmt.Fprintf(&b, "%d", seqs[i])
		}
		i = j + 1
	}
	if b.Len() == 0 {
		return "nothing"
	}
	return b.String()
}

// span returns lo..hi.
func span(lo, hi uint64) []uint64 {
	var s []uint64
	for n := lo; n <= hi; n++ {
		s = append(s, n)
	}
	return s
}

// TestPairTakeoverReplayBound states the replay bound of a takeover: the
// new active's inbound windows start where the old active last reported
// them, so the packets the old active accepted after its last report (at
// most a sweep interval and the link's delay before it failed) can be
// accepted once more, and every reported one is refused. A state the
// standby installs after the reports gets the ledger's window at the
// takeover (activate), not only the states the reports found.
func TestPairTakeoverReplayBound(t *testing.T) {
	a, b, start := newPairNodes(t)
	start()
	a.setRole(t, wire.PairRoleActive)
	in, late := pairState(t, 0x100, sa.DirIn), pairState(t, 0x101, sa.DirIn)
	sa1, sb1 := a.add(t, in), b.add(t, in)
	sa2 := a.add(t, late)

	if got := acceptAll(sa1, 1000); !slices.Equal(got, span(1, 1000)) {
		t.Fatalf("the active accepted %s of 1..1000", ranges(got))
	}
	if got := acceptAll(sa2, 500); len(got) != 500 {
		t.Fatalf("the active accepted %s of 1..500", ranges(got))
	}
	pairWait(t, "the standby's state at 1000", func() bool { return sb1.ReplayTop() == 1000 })
	pairWait(t, "the ledger's window of the late key at 500", func() bool {
		w, ok := b.node.Window(sa2.Fingerprint())
		return ok && w.Top == 500
	})
	sb2 := b.add(t, late)
	if sb2.ReplayTop() != 0 {
		t.Fatalf("a state installed on the standby starts at %d", sb2.ReplayTop())
	}

	// The old active's reports stop; it accepts 100 more.
	a.conn.cut.Store(true)
	if got := acceptAll(sa1, 1100); !slices.Equal(got, span(1001, 1100)) {
		t.Fatalf("the active accepted %s of 1..1100, want 1001..1100", ranges(got))
	}
	st := b.setRole(t, wire.PairRoleActive)
	if st.Released != 0 || st.Silent != 0 {
		t.Fatalf("takeover without outbound states: %+v", st)
	}
	if top := sb1.ReplayTop(); top != 1000 {
		t.Fatalf("the new active's window starts at %d, want 1000 (the last report)", top)
	}
	if got := acceptAll(sb1, 1100); !slices.Equal(got, span(1001, 1100)) {
		t.Fatalf("the new active accepted %s of a replay of 1..1100, want exactly 1001..1100 (accepted after the last report)", ranges(got))
	}
	if got := acceptAll(sb1, 1100); len(got) != 0 {
		t.Fatalf("a second replay: the new active accepted %s", ranges(got))
	}
	if got := acceptAll(sb2, 500); len(got) != 0 {
		t.Fatalf("the state installed after the reports accepted %s of a replay of 1..500", ranges(got))
	}
}

// TestPairWindowsUnion: the standby merges the windows reported as the
// union of what they refused, holes included; a stale report reopens
// nothing, and a hole the active never filled stays acceptable exactly
// once after the takeover.
func TestPairWindowsUnion(t *testing.T) {
	a, b, start := newPairNodes(t)
	start()
	a.setRole(t, wire.PairRoleActive)
	in := pairState(t, 0x200, sa.DirIn)
	sa1, sb1 := a.add(t, in), b.add(t, in)
	fp := sa1.Fingerprint()

	for seq := uint64(1); seq <= 1000; seq++ {
		if seq != 990 && seq != 995 && !accept(sa1, seq) {
			t.Fatalf("the active refused %d", seq)
		}
	}
	pairWait(t, "a report of 1000", func() bool { w, ok := b.node.Window(fp); return ok && w.Top == 1000 })
	stale, _ := b.node.Window(fp)
	for _, hole := range []uint64{990, 995} {
		if esp.ReplayStateSeen(stale.Top, stale.Bitmap, hole) {
			t.Fatalf("the report counts the hole %d as seen", hole)
		}
	}
	// 995 arrives late; the window moves on to 1010.
	if !accept(sa1, 995) {
		t.Fatal("the active refused the late 995")
	}
	for seq := uint64(1001); seq <= 1010; seq++ {
		accept(sa1, seq)
	}
	pairWait(t, "a report of 1010 with 995", func() bool {
		w, ok := b.node.Window(fp)
		return ok && w.Top == 1010 && esp.ReplayStateSeen(w.Top, w.Bitmap, 995) && sb1.ReplayTop() == 1010
	})
	a.conn.cut.Store(true)
	// The stale report, replayed: to the ledger and to the state.
	if err := b.node.Ledger().Apply(&pairsync.Message{Type: pairsync.TypeWindows, Windows: []pairsync.Window{stale}}); err != nil {
		t.Fatal(err)
	}
	mergeWindows(b.db, []pairsync.Window{stale})
	if w, _ := b.node.Window(fp); w.Top != 1010 || !esp.ReplayStateSeen(w.Top, w.Bitmap, 995) || esp.ReplayStateSeen(w.Top, w.Bitmap, 990) {
		t.Fatalf("the ledger's window after a stale report: top %d, 995 seen %v, 990 seen %v",
			w.Top, esp.ReplayStateSeen(w.Top, w.Bitmap, 995), esp.ReplayStateSeen(w.Top, w.Bitmap, 990))
	}

	b.setRole(t, wire.PairRoleActive)
	if got := acceptAll(sb1, 1010); !slices.Equal(got, []uint64{990}) {
		t.Fatalf("the new active accepted %s of a replay of 1..1010, want only the hole 990", ranges(got))
	}
	if got := acceptAll(sb1, 1010); len(got) != 0 {
		t.Fatalf("a second replay: the new active accepted %s", ranges(got))
	}
}

// TestPairRoleTakeover: PAIR_ROLE standby, then active, on a node whose
// DB holds two silent outbound states: the one whose key the active
// reported (fresh) is released above the report in a block of node 2's
// own; the one without a report stays silent. Standby clears the counts.
func TestPairRoleTakeover(t *testing.T) {
	a, b, start := newPairNodes(t)
	start()
	a.setRole(t, wire.PairRoleActive)
	out, unreported := pairState(t, 0x300, sa.DirOut), pairState(t, 0x301, sa.DirOut)
	a.add(t, out)
	reported, silent := b.add(t, out), b.add(t, unreported)
	fp := reported.Fingerprint()
	var report uint64
	pairWait(t, "a fresh report", func() bool { v, ok := b.node.Report(fp); report = v; return ok })

	st := b.setRole(t, wire.PairRoleStandby)
	if st.Released != 0 || st.Silent != 0 || st.Node != 2 {
		t.Fatalf("standby: %+v", st)
	}
	if !reported.Silent() || !silent.Silent() {
		t.Fatal("a standby's outbound state hands out numbers")
	}
	st = b.setRole(t, wire.PairRoleActive)
	if st.Released != 1 || st.Silent != 1 {
		t.Fatalf("takeover: released %d, silent %d; want 1 and 1", st.Released, st.Silent)
	}
	if reported.Silent() || !silent.Silent() {
		t.Fatalf("after the takeover: the reported state silent %v, the unreported one %v", reported.Silent(), silent.Silent())
	}
	first, n := reported.ReserveSeq(1)
	if n != 1 || first <= report || (first-1)/sa.DefaultSeqBlock%2 != 1 {
		t.Fatalf("the released state hands out %d (%d granted): want one above the report %d, in a block of node 2", first, n, report)
	}
	if _, n := silent.ReserveSeq(1); n != 0 {
		t.Fatal("the unreported state hands out a number")
	}
	if st := b.setRole(t, wire.PairRoleStandby); st.Released != 0 || st.Silent != 0 {
		t.Fatalf("standby again: %+v", st)
	}
}

// TestReadPairKey: the pair's key file must be 64 hex digits that others
// may not read; an error never shows a digit of it (TestPairKeyFile: the
// rest of the key file rule).
func TestReadPairKey(t *testing.T) {
	dir := t.TempDir()
	good := strings.Repeat("0123456789abcdef", 4)
	for _, c := range []struct {
		name, content string
		mode          os.FileMode
		ok            bool
	}{
		{"good", good + "\n", 0o600, true},
		{"group-readable", good, 0o640, true},
		{"world-readable", good, 0o644, false},
		{"short", good[:62], 0o600, false},
		{"not hex", "zq" + good[2:], 0o600, false},
	} {
		path := filepath.Join(dir, c.name)
		if err := os.WriteFile(path, []byte(c.content), c.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, c.mode); err != nil {
			t.Fatal(err)
		}
		k, err := readPairKey(path)
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v", c.name, err)
		}
		if err != nil && (strings.Contains(err.Error(), "zq") || strings.Contains(err.Error(), "'z'") || strings.Contains(err.Error(), "0123456789")) {
			t.Errorf("%s: the error shows the key: %v", c.name, err)
		}
		if c.ok && hex.EncodeToString(k[:]) != good {
			t.Errorf("%s: key %x", c.name, k)
		}
	}
}
