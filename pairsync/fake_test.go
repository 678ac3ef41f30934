package pairsync

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
)

// fakeConn is one node's end of an in-process pair link: what it sends
// goes to its link, which delivers it to the other node's receive (the
// addresses only name the nodes: nothing is sent on a network).
type fakeConn struct {
	local  net.Addr
	out    chan []byte
	closed chan struct{}
	once   sync.Once
}

func (c *fakeConn) ReadFrom([]byte) (int, net.Addr, error) { <-c.closed; return 0, nil, net.ErrClosed }

// WriteTo queues b, or drops it when the queue is full, as UDP would.
func (c *fakeConn) WriteTo(b []byte, _ net.Addr) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	case c.out <- append([]byte(nil), b...):
	default:
	}
	return len(b), nil
}
func (c *fakeConn) Close() error                     { c.once.Do(func() { close(c.closed) }); return nil }
func (c *fakeConn) LocalAddr() net.Addr              { return c.local }
func (c *fakeConn) SetDeadline(time.Time) error      { return nil }
func (c *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fakeConn) SetWriteDeadline(time.Time) error { return nil }

// link carries two fake nodes' messages in order, one goroutine per
// direction; a test drops or holds them by sender and type, and keeps a
// copy of everything each node sent.
type link struct {
	mu   sync.Mutex
	drop [3]map[Type]bool // by sending node (1, 2)
	hold [3]map[Type]bool
	held [3][][]byte
	sent [3][][]byte
}

// set makes messages of types ts from node from dropped (drop) or held.
func (l *link) set(from int, drop bool, ts ...Type) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[Type]bool{}
	for _, t := range ts {
		m[t] = true
	}
	if drop {
		l.drop[from] = m
	} else {
		l.hold[from] = m
	}
}

// take returns and forgets what node from sent (all) or what was held.
func (l *link) take(from int, held bool) [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := &l.sent[from]
	if held {
		p = &l.held[from]
	}
	out := *p
	*p = nil
	return out
}

// quiesce drops every message both ways from now on and returns once
// each direction carried one more: nothing sent before is in flight.
func (l *link) quiesce(t *testing.T) {
	t.Helper()
	all := []Type{TypeReserve, TypeAck, TypeWindows, TypeHello, TypeOwn}
	l.set(1, true, all...)
	l.set(2, true, all...)
	l.mu.Lock()
	n1, n2 := len(l.sent[1]), len(l.sent[2])
	l.mu.Unlock()
	waitFor(t, "a message each way after the cut", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.sent[1]) > n1 && len(l.sent[2]) > n2
	})
}

// carry delivers from's messages to to until ctx is done.
func (l *link) carry(ctx context.Context, from int, c *fakeConn, to *Node) {
	for {
		var b []byte
		select {
		case <-ctx.Done():
			return
		case b = <-c.out:
		}
		ty := Type(b[5])
		l.mu.Lock()
		l.sent[from] = append(l.sent[from], b)
		drop, hold := l.drop[from][ty], l.hold[from][ty]
		if hold {
			l.held[from] = append(l.held[from], b)
		}
		l.mu.Unlock()
		if !drop && !hold {
			to.receive(b)
		}
	}
}

// fakePair is two Nodes (1 and 2) on a link, running.
type fakePair struct {
	a, b         *Node
	astore, bsto *memStore
	link         *link
}

var (
	fakeAddr1 = &net.UDPAddr{IP: net.IPv4(198, 18, 9, 1), Port: 4520}
	fakeAddr2 = &net.UDPAddr{IP: net.IPv4(198, 18, 9, 2), Port: 4520}
)

// newFakePair starts nodes 1 and 2 (both standby) with testInterval and
// testLease unless edit changes their Configs.
func newFakePair(t *testing.T, edit ...func(a, b *Config)) *fakePair {
	t.Helper()
	p := &fakePair{astore: newMemStore(), bsto: newMemStore(), link: &link{}}
	ca := &fakeConn{local: fakeAddr1, out: make(chan []byte, 4096), closed: make(chan struct{})}
	cb := &fakeConn{local: fakeAddr2, out: make(chan []byte, 4096), closed: make(chan struct{})}
	acfg := Config{Key: testKey, Node: 1, Conn: ca, Peer: fakeAddr2, Store: p.astore, Interval: testInterval, Lease: testLease}
	bcfg := Config{Key: testKey, Node: 2, Conn: cb, Peer: fakeAddr1, Store: p.bsto, Interval: testInterval, Lease: testLease}
	for _, e := range edit {
		e(&acfg, &bcfg)
	}
	var err error
	if p.a, err = NewNode(acfg); err != nil {
		t.Fatal(err)
	}
	if p.b, err = NewNode(bcfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, f := range []func(){
		func() { p.link.carry(ctx, 1, ca, p.b) }, func() { p.link.carry(ctx, 2, cb, p.a) },
		func() { p.a.Run(ctx) }, func() { p.b.Run(ctx) },
	} {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	t.Cleanup(func() { cancel(); p.a.Close(); p.b.Close(); wg.Wait() })
	return p
}

// checkLease is the lease's promise at the moment node a's Reserve(limit)
// of f returned: node b holds no fresh report of f below limit, so a
// takeover by b continues above everything a may send.
func checkLease(t *testing.T, b *Node, f crypto.Fingerprint, limit uint64, what string) {
	t.Helper()
	if v, ok := b.Report(f); ok && v < limit {
		t.Fatalf("%s: Reserve(%d) returned while the standby holds %d fresh: a takeover would start below the active's numbers", what, limit, v)
	}
}
