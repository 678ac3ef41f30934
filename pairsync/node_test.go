package pairsync

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
)

// memStore is a Store in memory, counting its reservations.
type memStore struct {
	mu   sync.Mutex
	high map[crypto.Fingerprint]uint64
}

func newMemStore() *memStore { return &memStore{high: map[crypto.Fingerprint]uint64{}} }

func (m *memStore) Resume(fp crypto.Fingerprint, _ bool) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.high[fp], nil
}
func (m *memStore) Reserve(fp crypto.Fingerprint, limit uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.high[fp] = max(m.high[fp], limit)
	return nil
}
func (m *memStore) Retire(fp crypto.Fingerprint, last uint64) error { return nil }
func (m *memStore) Inbound(crypto.Fingerprint, bool) error          { return nil }
func (m *memStore) RetireInbound(crypto.Fingerprint) error          { return nil }
func (m *memStore) Used(crypto.Fingerprint) (bool, bool, error)     { return false, false, nil }

// lossyConn drops what it sends while cut, and every drop-th datagram.
type lossyConn struct {
	net.PacketConn
	cut  atomic.Bool
	drop int64
	n    atomic.Int64
}

func (c *lossyConn) WriteTo(b []byte, a net.Addr) (int, error) {
	if c.cut.Load() || (c.drop > 0 && c.n.Add(1)%c.drop == 0) {
		return len(b), nil
	}
	return c.PacketConn.WriteTo(b, a)
}

// testPair is two nodes on loopback UDP.
type testPair struct {
	a, b         *Node
	ac, bc       *lossyConn
	astore, bsto *memStore
	cancel       context.CancelFunc
	wg           sync.WaitGroup
}

const (
	testInterval = 40 * time.Millisecond
	testLease    = 400 * time.Millisecond
)

func listen(t *testing.T) net.PacketConn {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newTestPair(t *testing.T, drop int64, edit ...func(a, b *Config)) *testPair {
	t.Helper()
	p := &testPair{astore: newMemStore(), bsto: newMemStore()}
	ca, cb := listen(t), listen(t)
	p.ac, p.bc = &lossyConn{PacketConn: ca, drop: drop}, &lossyConn{PacketConn: cb, drop: drop}
	var err error
	acfg := Config{Key: testKey, Node: 1, Conn: p.ac, Peer: cb.LocalAddr(), Store: p.astore, Interval: testInterval, Lease: testLease}
	bcfg := Config{Key: testKey, Node: 2, Conn: p.bc, Peer: ca.LocalAddr(), Store: p.bsto, Interval: testInterval, Lease: testLease}
	for _, e := range edit {
		e(&acfg, &bcfg)
	}
	p.a, err = NewNode(acfg)
	if err != nil {
		t.Fatal(err)
	}
	p.b, err = NewNode(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	for _, n := range []*Node{p.a, p.b} {
		p.wg.Add(1)
		go func() { defer p.wg.Done(); n.Run(ctx) }()
	}
	t.Cleanup(p.stop)
	return p
}

func (p *testPair) stop() {
	p.cancel()
	p.a.Close()
	p.b.Close()
	p.wg.Wait()
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reserveBounded runs Reserve with a bound.
func reserveBounded(t *testing.T, n *Node, f crypto.Fingerprint, limit uint64) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- n.Reserve(f, limit) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Reserve(%d): %v", limit, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Reserve(%d) still waits after 10 s", limit)
	}
}

// TestNodeAcked: an active's Reserve returns once the standby recorded
// it durably, and the standby's report turns fresh.
func TestNodeAcked(t *testing.T) {
	p := newTestPair(t, 0)
	p.a.SetRole(RoleActive)
	waitFor(t, "the standby's hello", func() bool { _, ok := p.a.PeerHeard(); return ok })
	for i, lim := range []uint64{1 << 20, 3 << 20, 5 << 20} {
		reserveBounded(t, p.a, fp(1), lim)
		if got, _ := p.bsto.Resume(fp(1), true); got < lim {
			t.Fatalf("reservation %d: the standby's store holds %d after Reserve(%d) returned", i, got, lim)
		}
		if got, _ := p.astore.Resume(fp(1), true); got != lim {
			t.Fatalf("the active's own store holds %d, want %d", got, lim)
		}
	}
	waitFor(t, "a fresh report", func() bool { v, ok := p.b.Report(fp(1)); return ok && v == 5<<20 })
	if s := p.a.Stats(); s.LeaseWaits != 0 || s.AckWaits == 0 {
		t.Fatalf("stats %+v: every reservation should have been acknowledged", s)
	}
	// A key the active never reported is not fresh.
	if _, ok := p.b.Report(fp(2)); ok {
		t.Fatal("a report for a key never carried")
	}
}

// TestNodeLease checks the lease's promise whatever the link does: at
// the moment an active's Reserve(R) returns, the standby either has R or
// holds no fresh report for the key. The link from the active is cut in
// one direction (the standby's hellos still arrive), then both ways.
func TestNodeLease(t *testing.T) {
	for _, both := range []bool{false, true} {
		p := newTestPair(t, 0)
		p.a.SetRole(RoleActive)
		reserveBounded(t, p.a, fp(1), 1<<20)
		waitFor(t, "a fresh report", func() bool { _, ok := p.b.Report(fp(1)); return ok })
		p.ac.cut.Store(true)
		if both {
			p.bc.cut.Store(true)
		}
		start := time.Now()
		reserveBounded(t, p.a, fp(1), 3<<20)
		if v, ok := p.b.Report(fp(1)); ok && v < 3<<20 {
			t.Fatalf("both ways cut %v: Reserve(3<<20) returned after %v while the standby holds %d fresh", both, time.Since(start), v)
		}
		if got, _ := p.bsto.Resume(fp(1), true); got >= 3<<20 {
			t.Fatalf("the cut link carried the reservation")
		}
		if p.a.Stats().LeaseWaits == 0 {
			t.Fatal("the reservation went without an ack and without the lease")
		}
		// Healed, the sweep brings the standby up to date and fresh again.
		p.ac.cut.Store(false)
		p.bc.cut.Store(false)
		waitFor(t, "the sweep after the cut", func() bool { v, ok := p.b.Report(fp(1)); return ok && v == 3<<20 })
		p.stop()
	}
}

// TestNodeLoss: with every third datagram lost both ways, reservations
// still end acknowledged and the standby's ledger exact.
func TestNodeLoss(t *testing.T) {
	p := newTestPair(t, 3)
	p.a.SetRole(RoleActive)
	waitFor(t, "the standby's hello", func() bool { _, ok := p.a.PeerHeard(); return ok })
	var lim uint64
	for i := range 40 {
		lim = uint64(i+1) << 20
		reserveBounded(t, p.a, fp(byte(i%4)), lim)
	}
	waitFor(t, "every key fresh and exact", func() bool {
		for k := range 4 {
			want := uint64(36+k+1) << 20
			if v, ok := p.b.Report(fp(byte(k))); !ok || v != want {
				return false
			}
		}
		return true
	})
}

// TestNodeForged: datagrams under another key, cut, altered or replayed
// change nothing and are counted.
func TestNodeForged(t *testing.T) {
	p := newTestPair(t, 0)
	p.a.SetRole(RoleActive)
	reserveBounded(t, p.a, fp(1), 5<<20)
	waitFor(t, "a fresh report", func() bool { v, ok := p.b.Report(fp(1)); return ok && v == 5<<20 })

	evil := listen(t)
	defer evil.Close()
	to := p.bc.PacketConn.LocalAddr()
	other, k12 := Key{1}, testKey.Direction(1)
	forged, _ := (&Message{Type: TypeReserve, Node: 1, Params: p.a.digest, Epoch: p.a.Epoch(), Counter: 1 << 40, Reservations: []Reservation{{fp(1), 1 << 62}}}).Append(nil, &other)
	old, _ := (&Message{Type: TypeReserve, Node: 1, Params: p.a.digest, Epoch: p.a.Epoch(), Counter: 1, Reservations: []Reservation{{fp(1), 1 << 20}}}).Append(nil, &k12)
	altered := append([]byte(nil), old...)
	altered[len(altered)-40] ^= 1
	before := p.b.Stats().Rejected
	for _, b := range [][]byte{forged, altered, old[:10], []byte("garbage"), old} {
		evil.WriteTo(b, to) // from another address than the peer's: never read
	}
	waitFor(t, "the datagrams of another address counted", func() bool { return p.b.Stats().Rejected >= before+5 })
	for _, b := range [][]byte{forged, altered, old[:10], []byte("garbage")} {
		p.b.receive(b) // as if from the peer's address
	}
	p.b.receive(old) // authentic but old: dropped as a replay
	if s := p.b.Stats(); s.Rejected < before+9 || s.Replayed == 0 {
		t.Fatalf("stats %+v: want 4 more rejected and a replay", s)
	}
	if v, _ := p.b.Ledger().Reserved(fp(1)); v != 5<<20 {
		t.Fatalf("the ledger holds %d after forged and old messages, want %d", v, 5<<20)
	}
}

// TestNodeStandbyRestart: a standby that restarts (new epoch, its store
// kept) is brought up to date by the sweep and holds fresh reports again.
func TestNodeStandbyRestart(t *testing.T) {
	p := newTestPair(t, 0)
	p.a.SetRole(RoleActive)
	reserveBounded(t, p.a, fp(7), 9<<20)
	waitFor(t, "a fresh report", func() bool { _, ok := p.b.Report(fp(7)); return ok })
	addr := p.bc.PacketConn.LocalAddr()
	p.b.Close()
	// The restarted standby, on the same address and store.
	c, err := net.ListenPacket("udp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	b2, err := NewNode(Config{Key: testKey, Node: 2, Conn: c, Peer: p.ac.PacketConn.LocalAddr(), Store: p.bsto, Interval: testInterval, Lease: testLease})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b2.Run(ctx) }()
	defer func() { cancel(); b2.Close(); <-done }()
	if _, ok := b2.Report(fp(7)); ok {
		t.Fatal("a fresh report before anything was heard")
	}
	waitFor(t, "the restarted standby's fresh report", func() bool { v, ok := b2.Report(fp(7)); return ok && v == 9<<20 })
}

// TestNodeStandbySince: after a demotion, reports count only once the
// active echoed a stamp taken since; the windows reach OnWindows.
func TestNodeStandbySince(t *testing.T) {
	var got atomic.Int64
	p := newTestPair(t, 0, func(a, b *Config) {
		b.OnWindows = func(ws []Window) { got.Add(int64(len(ws))) }
		a.Windows = func() []Window { return []Window{{FP: fp(9), Top: 77, Bitmap: []byte{1}}} }
	})
	p.a.SetRole(RoleActive)
	reserveBounded(t, p.a, fp(1), 1<<20)
	waitFor(t, "windows", func() bool { w, ok := p.b.Window(fp(9)); return ok && w.Top == 77 && got.Load() > 0 })
	p.ac.cut.Store(true)
	p.b.SetRole(RoleActive)
	p.b.SetRole(RoleStandby)
	if _, ok := p.b.Report(fp(1)); ok {
		t.Fatal("a report stays fresh across a demotion")
	}
	p.ac.cut.Store(false)
	waitFor(t, "a fresh report after the demotion", func() bool { _, ok := p.b.Report(fp(1)); return ok })
}

// TestNodeSplitBrain: two active nodes record each other's reservations
// and hand them to OnPeerActive; neither waits for an ack for longer
// than the lease.
func TestNodeSplitBrain(t *testing.T) {
	var mu sync.Mutex
	got := map[crypto.Fingerprint]uint64{}
	p := newTestPair(t, 0, func(a, b *Config) {
		b.OnPeerActive = func(rs []Reservation) {
			mu.Lock()
			defer mu.Unlock()
			for _, r := range rs {
				got[r.FP] = max(got[r.FP], r.Limit)
			}
		}
	})
	p.a.SetRole(RoleActive)
	p.b.SetRole(RoleActive)
	reserveBounded(t, p.a, fp(3), 5<<20)
	waitFor(t, "the other active's reservation", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got[fp(3)] == 5<<20
	})
	if v, _ := p.bsto.Resume(fp(3), true); v != 5<<20 {
		t.Errorf("the other active's store holds %d, want %d", v, 5<<20)
	}
	if p.b.Stats().SplitBrain == 0 {
		t.Error("no split brain counted")
	}
}

// TestNodeStandbyOwn: two standbys report their own reservations (what
// each may have sent itself, from its store), so that whichever becomes
// active first continues above the other's even when neither was active.
func TestNodeStandbyOwn(t *testing.T) {
	p := newTestPair(t, 0)
	if err := p.astore.Reserve(fp(4), 7<<20); err != nil { // an earlier run's record
		t.Fatal(err)
	}
	if v, err := p.a.Resume(fp(4), true); err != nil || v != 7<<20 {
		t.Fatalf("Resume: %d, %v", v, err)
	}
	reserveBounded(t, p.a, fp(5), 1<<20) // a silent state's first block
	waitFor(t, "the other standby's own reservations, fresh", func() bool {
		v4, ok4 := p.b.Report(fp(4))
		v5, ok5 := p.b.Report(fp(5))
		return ok4 && ok5 && v4 == 7<<20 && v5 == 1<<20
	})
	if s := p.a.Stats(); s.Sent[TypeOwn] == 0 || s.Sent[TypeReserve] != 0 {
		t.Errorf("a standby sent %d own and %d reserve messages", s.Sent[TypeOwn], s.Sent[TypeReserve])
	}
}
