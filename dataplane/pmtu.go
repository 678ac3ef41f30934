package dataplane

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// pmtuRefresh is how often the refresher looks every known peer's route up
// again; a peer not sent to for pmtuIdleRounds refreshes is forgotten.
const (
	pmtuRefresh    = 30 * time.Second
	pmtuIdleRounds = 2
)

// pathMTUs is the outer path MTU towards each peer, shared by the TUN
// readers. A reader looks a peer up itself only the first time any reader
// sends to it; refresh (the refresher goroutine) looks the known peers up
// again, so that the packet path reads an atomic and makes no netlink call.
type pathMTUs struct {
	fixed   int                           // Config.OuterMTU, or DefaultOuterMTU without pathMTU; 0: routed
	pathMTU func(netip.Addr) (int, error) // IO.PathMTU; nil when fixed

	mu    sync.Mutex
	peers map[netip.Addr]*peerMTU
	gen   atomic.Uint64 // bumped when peers are forgotten

	readerLookups atomic.Uint64 // lookups made on the packet path
}

// peerMTU is one peer's entry.
type peerMTU struct {
	mtu  atomic.Int32
	used atomic.Bool // read since the last refresh
	gone atomic.Bool // forgotten by the table: look the peer up again
	idle int         // refreshes without use; the refresher's only
}

func (t *pathMTUs) init(fixed int, pathMTU func(netip.Addr) (int, error)) {
	t.fixed, t.pathMTU = fixed, pathMTU
	if fixed == 0 && pathMTU == nil {
		t.fixed = DefaultOuterMTU
	}
	t.peers = make(map[netip.Addr]*peerMTU)
}

// routed reports whether the MTUs come from the routing table (and so a
// refresher is due).
func (t *pathMTUs) routed() bool { return t.fixed == 0 }

// lookup asks the routing table for dst's path MTU.
func (t *pathMTUs) lookup(dst netip.Addr) int32 {
	mtu, err := t.pathMTU(dst)
	if err != nil || mtu < 576 || mtu > 65535 {
		return DefaultOuterMTU
	}
	return int32(mtu)
}

// entry returns dst's entry, making it (with one lookup) if no reader has
// sent to dst since it was last forgotten.
func (t *pathMTUs) entry(dst netip.Addr) *peerMTU {
	t.mu.Lock()
	e := t.peers[dst]
	t.mu.Unlock()
	if e != nil {
		return e
	}
	mtu := t.lookup(dst)
	t.readerLookups.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	if e = t.peers[dst]; e == nil {
		e = new(peerMTU)
		e.mtu.Store(mtu)
		t.peers[dst] = e
	}
	return e
}

// refresh looks up every peer sent to since the last refresh and forgets
// those idle for pmtuIdleRounds refreshes. It runs off the packet path.
func (t *pathMTUs) refresh() {
	t.mu.Lock()
	dsts := make([]netip.Addr, 0, len(t.peers))
	es := make([]*peerMTU, 0, len(t.peers))
	for dst, e := range t.peers {
		dsts, es = append(dsts, dst), append(es, e)
	}
	t.mu.Unlock()
	forgot := false
	for i, e := range es {
		if e.used.Swap(false) {
			e.idle = 0
		} else if e.idle++; e.idle >= pmtuIdleRounds {
			t.mu.Lock()
			delete(t.peers, dsts[i])
			t.mu.Unlock()
			e.gone.Store(true)
			forgot = true
			continue
		}
		e.mtu.Store(t.lookup(dsts[i]))
	}
	if forgot {
		t.gen.Add(1)
	}
}

// refresher runs refresh every pmtuRefresh until d stops.
func (d *Device) refresher() {
	defer d.wg.Done()
	tick := time.NewTicker(pmtuRefresh)
	defer tick.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-tick.C:
			d.pmtu.refresh()
		}
	}
}

// pmtuCache is one TUN reader's view of the table: its own map of the
// entries it has used, so that a lookup takes no lock.
type pmtuCache struct {
	t   *pathMTUs
	m   map[netip.Addr]*peerMTU
	gen uint64
}

func (c *pmtuCache) init(t *pathMTUs) {
	c.t = t
	c.m = make(map[netip.Addr]*peerMTU)
}

// get returns the outer MTU towards dst.
func (c *pmtuCache) get(dst netip.Addr) int {
	if c.t.fixed > 0 {
		return c.t.fixed
	}
	e := c.m[dst]
	if e == nil || e.gone.Load() {
		if g := c.t.gen.Load(); g != c.gen {
			c.gen = g
			for a, old := range c.m {
				if old.gone.Load() {
					delete(c.m, a)
				}
			}
		}
		e = c.t.entry(dst)
		c.m[dst] = e
	}
	if !e.used.Load() {
		e.used.Store(true)
	}
	return int(e.mtu.Load())
}
