package dataplane

import (
	"math/bits"
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
	dropSA            // refused by the state (esp/crypto, selectors, ...): counted on it with reason
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
	transport  bool           // sa is a transport-mode state
	ttl        uint8          // outbound transport mode: the packet's TTL or hop limit
	ipID       uint16         // outbound transport mode: the packet's IPv4 Identification
	flowLabel  uint32         // outbound transport mode: the packet's IPv6 flow label
	from       netip.AddrPort // inbound ESP-in-UDP: the outer source, for NAT mapping changes
	mtu        int            // outbound: path MTU to the peer
	frag       fragMode       // outbound: whether the outer packet may be fragmented
	shard      uint8          // the in-order shard of sa (shardOf), when sa is set
	ifc        *iface         // inbound: the interface of sa's ID, to write to
	drop       cause
	reason     sa.DropReason // for dropSA
}

// batch is the unit every stage passes on. crypto counts one while a
// handed-off batch waits for its crypto: the reader adds it, the worker
// that processes the batch marks it done, and the in-order stages of the
// batch's shards wait for that.
type batch struct {
	crypto sync.WaitGroup
	// refs, for a handed-off batch, counts the in-order shards that are to
	// finish it and the worker that is to do its crypto: whoever drops the
	// last one returns it to the pool (queues.unref).
	refs  atomic.Int32
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

// maxShards bounds the number of in-order shards per direction: a
// batch's shards are a bit mask (producer.mask) and an element's shard a
// byte.
const maxShards = 64

// shardCount is the number of in-order shards per direction for a device
// with the given number of workers: one per worker, so that every core can
// run an in-order stage, at least one and at most maxShards. It does not
// grow with the number of states.
func shardCount(workers int) int { return min(max(workers, 1), maxShards) }

// minShardQueue is the least in-order queue length of a shard.
const minShardQueue = 2

// shardQueueLen is the in-order queue length of each of n shards when a
// direction may queue queueLen batches: the shards share that budget
// (rounded up, at least minShardQueue each), so that the memory a
// direction may hold does not grow with the number of workers.
func shardQueueLen(queueLen, n int) int {
	return max((queueLen+n-1)/n, minShardQueue)
}

// shardOf is the in-order shard of the state with SPI spi among n: a
// multiplicative hash of the SPI, so that states spread over the shards
// whatever their SPIs have in common (IKE daemons allocate them at random,
// manual keying often in sequence).
func shardOf(spi uint32, n int) uint8 {
	return uint8(uint64(spi*0x9e3779b1) * uint64(n) >> 32)
}

// shard is one in-order stage's queue: the batches holding packets of its
// states, in the order its producers pushed them.
type shard struct {
	inorder chan *batch
	done    atomic.Uint64 // batches the shard's stage has finished
}

// queues are one direction's bounded queues: the crypto queue, served by
// the workers, and the in-order queue of each shard, served by the
// shard's stage (a sender or TUN writer). A batch enters the in-order
// queue of every shard it holds packets of (one for a batch of one state)
// before it enters crypto, once, and a shard's stage, which holds at most
// one batch it has taken out of its queue, cannot finish it before a
// worker took it out of crypto. So crypto never holds more than
// len(shards)*(QueueLen+1) batches, and with that many slots a push to it
// after a successful push to a shard never blocks.
type queues struct {
	crypto chan *batch
	shards []shard
	pool   *pool          // where the last reference of a batch returns it
	wg     sync.WaitGroup // producers; the last one closes the queues
	pushed atomic.Uint64  // pushes to the shards (counted before they are visible)
	done   atomic.Uint64  // batches the shards' stages have finished, summed
}

// newQueues returns the queues of nShards shards of n slots each.
func newQueues(nShards, n int, p *pool) *queues {
	q := &queues{crypto: make(chan *batch, nShards*(n+1)), shards: make([]shard, nShards), pool: p}
	for k := range q.shards {
		q.shards[k].inorder = make(chan *batch, n)
	}
	return q
}

// stallTimeout is how long a producer waits for room in a full queue
// while the in-order stage finishes no batch: past it, the stage is stuck
// (a sender blocked on a full socket, say) and the producer drops instead
// of waiting, until the stage moves again.
const stallTimeout = 100 * time.Millisecond

// producer is one producer's state for push. mask and live describe the
// batch being pushed; stalled and at, each shard's stall.
type producer struct {
	timer   *time.Timer
	mask    uint64   // the shards the batch holds live packets of
	live    []int    // the batch's live packets per shard
	stalled []bool   // the last push to the shard gave up on a stuck stage
	at      []uint64 // the shard's done count when it did
}

func newProducer(nShards int) *producer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &producer{timer: t, live: make([]int, nShards), stalled: make([]bool, nShards), at: make([]uint64, nShards)}
}

// add counts a live packet of shard k in the batch being classified.
func (p *producer) add(k uint8) {
	p.mask |= 1 << k
	p.live[k]++
}

// reset forgets the batch classified last.
func (p *producer) reset() {
	for m := p.mask; m != 0; m &= m - 1 {
		p.live[bits.TrailingZeros64(m)] = 0
	}
	p.mask = 0
}

// push hands b to the workers and to the in-order stage of each shard in
// p.mask, and returns how many of b's live packets it could not queue.
// When a shard's queue is full it waits for room, so that a burst is held
// by the kernel (the TUN's queue, the socket's receive buffer) rather than
// dropped here, as long as that shard's stage keeps finishing batches;
// when the stage has finished none for stallTimeout the push gives up on
// that shard (its packets are not queued) and goes on giving up at once
// until the stage moves. b goes to the workers as soon as one shard has
// taken it, before the push waits for another, so that the shards that
// took it never wait for one that is stuck. b's crypto must be pending
// (batch.crypto); if no shard took it, push marks it done and returns b to
// the pool. p is reset.
func (q *queues) push(b *batch, p *producer) (dropped int) {
	b.refs.Store(int32(bits.OnesCount64(p.mask)) + 1) // the shards and the worker
	queued := false
	var pending uint64
	for m := p.mask; m != 0; m &= m - 1 {
		k := bits.TrailingZeros64(m)
		q.pushed.Add(1) // before b is visible to the stage
		select {
		case q.shards[k].inorder <- b:
			p.stalled[k] = false
			queued = true
		default:
			q.pushed.Add(^uint64(0))
			pending |= 1 << k
		}
	}
	if queued {
		q.crypto <- b
	}
	for m := pending; m != 0; m &= m - 1 {
		k := bits.TrailingZeros64(m)
		q.pushed.Add(1)
		if q.wait(b, p, k) {
			if !queued {
				q.crypto <- b
				queued = true
			}
			continue
		}
		q.pushed.Add(^uint64(0))
		dropped += p.live[k]
		if queued {
			q.unref(b)
		}
	}
	p.reset()
	if !queued {
		b.crypto.Done()
		q.pool.put(b)
	}
	return dropped
}

// wait waits for room for b in shard k's full queue, and reports whether
// b went in: see push.
func (q *queues) wait(b *batch, p *producer, k int) bool {
	sh := &q.shards[k]
	done := sh.done.Load()
	if p.stalled[k] && p.at[k] == done {
		return false
	}
	p.stalled[k] = false
	for {
		p.timer.Reset(stallTimeout)
		select {
		case sh.inorder <- b:
			p.timer.Stop()
			return true
		case <-p.timer.C:
			now := sh.done.Load()
			if now == done {
				p.stalled[k], p.at[k] = true, now
				return false
			}
			done = now
		}
	}
}

// finished is called by shard k's stage when it has finished b.
func (q *queues) finished(b *batch, k int) {
	q.shards[k].done.Add(1)
	q.done.Add(1)
	q.unref(b)
}

// unref drops a reference to b (a shard's or the worker's) and returns b
// to the pool with the last one.
func (q *queues) unref(b *batch) {
	if b.refs.Add(-1) == 0 {
		q.pool.put(b)
	}
}

// producerDone is called by each producer when it stops.
func (q *queues) producerDone() { q.wg.Done() }

// closeWhenDone closes the queues once every producer has stopped.
func (q *queues) closeWhenDone() {
	q.wg.Wait()
	close(q.crypto)
	for k := range q.shards {
		close(q.shards[k].inorder)
	}
}
