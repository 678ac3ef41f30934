package dataplane

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/sa"
)

// cause says why an element is not sent or written; pass means it goes on.
type cause uint8

const (
	pass        cause = iota
	dropCounted       // counted where it was dropped (reader stage)
	dropSA            // refused by esp/crypto: counted per state with reason
	dropSelector
)

// fragMode says whether an outbound packet's outer packet may be
// fragmented.
type fragMode uint8

const (
	noFrag    fragMode = iota
	fragOK             // an IPv4 inner packet without DF: unless the outer DF is set
	fragForce          // an IPv6 inner packet within the IPv6 minimum MTU: always
)

// elem is one packet of a batch.
type elem struct {
	buf []byte // BufferSize bytes, owned by the batch

	sa  *sa.SA
	enc *esp.Encapsulator // outbound
	dec *esp.Decapsulator // inbound

	// Outbound: the inner packet is buf[start:end] until a worker
	// encapsulates it, the outer packet after. Inbound: the ESP packet,
	// then the inner packet.
	start, end int
	innerLen   int            // bytes accounted to the state
	seq        uint64         // sequence number
	record     bool           // inbound: authentic; the writer records seq in dec.Replay
	tos        uint8          // inbound: outer TOS / Traffic Class; outbound: the outer TOS to send
	df         bool           // outbound: the outer IPv4 DF bit
	from       netip.AddrPort // inbound ESP-in-UDP: the outer source, for NAT mapping changes
	mtu        int            // outbound: path MTU to the peer
	frag       fragMode       // outbound: whether the outer packet may be fragmented
	drop       cause
	reason     sa.DropReason // for dropSA
}

// batch is the unit every stage passes on. mu is locked while the batch
// waits for its crypto; the worker that processes it unlocks it, and the
// in-order stage locks it to wait for that.
type batch struct {
	mu    sync.Mutex
	out   bool // outbound
	elems []elem
	n     int // elements in use

	// held are the states the batch holds (sa.SA.Hold) from their lookup
	// until its crypto is done, each once, so that none has its transform
	// zeroed under a worker.
	held []*sa.SA

	// I/O vectors, allocated with the batch.
	bufs  [][]byte
	sizes []int
	msgs  []conn.Message
}

// pool recycles batches and their buffers.
type pool struct {
	p    sync.Pool
	size int // elements per batch
}

func newPool(size int) *pool {
	bp := &pool{size: size}
	bp.p.New = func() any {
		b := &batch{
			elems: make([]elem, size),
			held:  make([]*sa.SA, 0, size),
			bufs:  make([][]byte, size),
			sizes: make([]int, size),
			msgs:  make([]conn.Message, size),
		}
		for i := range b.elems {
			b.elems[i].buf = make([]byte, BufferSize)
		}
		return b
	}
	return bp
}

func (p *pool) get() *batch { return p.p.Get().(*batch) }

// put releases the states the batch still holds (if it never reached a
// worker), clears its references to states and returns it.
func (p *pool) put(b *batch) {
	b.release()
	for i := range b.n {
		e := &b.elems[i]
		e.sa, e.enc, e.dec = nil, nil, nil
	}
	b.n = 0
	p.p.Put(b)
}

// hold holds s for the batch unless it already does, and reports whether
// the batch may use s: false once s is dead. A batch holds few states, so
// a scan finds them.
func (b *batch) hold(s *sa.SA) bool {
	for _, h := range b.held {
		if h == s {
			return true
		}
	}
	if !s.Hold() {
		return false
	}
	b.held = append(b.held, s)
	return true
}

// release releases the states the batch holds. The worker calls it as soon
// as the batch's crypto is done: the in-order stages use the states'
// counters and replay windows, never their transforms.
func (b *batch) release() {
	for i, s := range b.held {
		s.Release()
		b.held[i] = nil
	}
	b.held = b.held[:0]
}

// queues are one direction's bounded queues. A batch enters inorder
// before crypto, and the in-order stage, which holds at most one batch it
// has taken out of inorder, cannot finish it before a worker took it out of
// crypto. So crypto never holds more than len(inorder)+1 batches, and with
// one more slot than inorder a push to it after a successful push to
// inorder never blocks.
type queues struct {
	crypto  chan *batch
	inorder chan *batch
	wg      sync.WaitGroup // producers; the last one closes the queues
	pushed  atomic.Uint64  // batches pushed (counted before they are visible)
	done    atomic.Uint64  // batches the in-order stage has finished
}

func newQueues(n int) *queues {
	return &queues{crypto: make(chan *batch, n+1), inorder: make(chan *batch, n)}
}

// stallTimeout is how long a producer waits for room in a full queue
// while the in-order stage finishes no batch: past it, the stage is stuck
// (a sender blocked on a full socket, say) and the producer drops instead
// of waiting, until the stage moves again.
const stallTimeout = 100 * time.Millisecond

// producer is one producer's state for push.
type producer struct {
	timer   *time.Timer
	stalled bool   // the last push gave up on a stuck stage
	at      uint64 // queues.done when it did
}

func newProducer() *producer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &producer{timer: t}
}

// push hands b to the workers and the in-order stage. When the in-order
// queue is full it waits for room, so that a burst is held by the kernel
// (the TUN's queue, the socket's receive buffer) rather than dropped here,
// as long as the in-order stage keeps finishing batches; when the stage
// has finished none for stallTimeout it reports false (b is not queued)
// and goes on reporting false at once until the stage moves. b must be
// locked.
func (q *queues) push(b *batch, p *producer) bool {
	q.pushed.Add(1) // before b is visible to the in-order stage
	if q.enqueue(b, p) {
		return true
	}
	q.pushed.Add(^uint64(0))
	return false
}

// enqueue is push without the count.
func (q *queues) enqueue(b *batch, p *producer) bool {
	select {
	case q.inorder <- b:
		q.crypto <- b
		p.stalled = false
		return true
	default:
	}
	done := q.done.Load()
	if p.stalled && p.at == done {
		return false
	}
	p.stalled = false
	for {
		p.timer.Reset(stallTimeout)
		select {
		case q.inorder <- b:
			p.timer.Stop()
			q.crypto <- b
			return true
		case <-p.timer.C:
			now := q.done.Load()
			if now == done {
				p.stalled, p.at = true, now
				return false
			}
			done = now
		}
	}
}

// producerDone is called by each producer when it stops.
func (q *queues) producerDone() { q.wg.Done() }

// closeWhenDone closes the queues once every producer has stopped.
func (q *queues) closeWhenDone() {
	q.wg.Wait()
	close(q.crypto)
	close(q.inorder)
}
