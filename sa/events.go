package sa

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/espd/espd/packet"
)

// EventKind says what an Event reports.
type EventKind uint8

// Event kinds, as XFRM's XFRM_MSG_EXPIRE (soft and hard) and
// XFRM_MSG_ACQUIRE.
const (
	// EventSoftExpire: a state passed a soft limit; rekey it.
	EventSoftExpire EventKind = iota
	// EventHardExpire: a state passed a hard limit and was removed.
	EventHardExpire
	// EventAcquire: outbound traffic matched a protect policy whose reqid
	// has no state; negotiate one.
	EventAcquire
	// EventMapping: authentic UDP-encapsulated packets of an inbound
	// state arrive from another address or port than the state's peer (a
	// NAT mapping changed, XFRM_MSG_MAPPING); update the states.
	EventMapping
)

var eventNames = [...]string{EventSoftExpire: "soft-expire", EventHardExpire: "hard-expire", EventAcquire: "acquire", EventMapping: "mapping"}

// String returns "soft-expire", "hard-expire", "acquire" or "mapping".
func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Event is a notification for the control plane.
type Event struct {
	Kind EventKind
	// SPI, Dst, ReqID and Dir identify the state of an expire event; for
	// an acquire, ReqID and Dir are the policy's and Dst the flow's.
	SPI    uint32
	Dst    netip.Addr
	ReqID  uint32
	Dir    Direction
	Reason ExpireReason // expire events
	Time   time.Time
	// Policy and Flow are what an acquire is about.
	Policy Policy
	Flow   packet.Flow
	// NewPeer is where a mapping event's packets now come from.
	NewPeer netip.AddrPort
}

// String describes the event.
func (e Event) String() string {
	if e.Kind == EventAcquire {
		return fmt.Sprintf("acquire reqid %d flow %v:%d -> %v:%d proto %d policy [%v]",
			e.ReqID, e.Flow.Src, e.Flow.SrcPort, e.Flow.Dst, e.Flow.DstPort, e.Flow.Proto, e.Policy)
	}
	if e.Kind == EventMapping {
		return fmt.Sprintf("mapping spi 0x%08x dst %v reqid %d: peer now %v", e.SPI, e.Dst, e.ReqID, e.NewPeer)
	}
	return fmt.Sprintf("%v spi 0x%08x dst %v dir %v reqid %d: %v", e.Kind, e.SPI, e.Dst, e.Dir, e.ReqID, e.Reason)
}

func (s *SA) expireEvent(k EventKind, r ExpireReason, db *DB) Event {
	return Event{Kind: k, SPI: s.spi, Dst: s.params.Load().cfg.Dst, ReqID: s.reqid, Dir: s.dir, Reason: r, Time: db.opts.Now()}
}

// Subscription receives the DB's events.
type Subscription struct {
	db      *DB
	ch      chan Event
	dropped atomic.Uint64
}

// Events returns the channel of events. It is closed by Close.
func (s *Subscription) Events() <-chan Event { return s.ch }

// Dropped returns how many events were dropped because the buffer was
// full.
func (s *Subscription) Dropped() uint64 { return s.dropped.Load() }

// Close stops the subscription and closes its channel. It may be called
// more than once.
func (s *Subscription) Close() {
	e := &s.db.evdb
	e.mu.Lock()
	defer e.mu.Unlock()
	if i := slices.Index(e.subs, s); i >= 0 {
		e.subs = slices.Delete(e.subs, i, i+1)
		close(s.ch)
	}
}

// evdb is the event half of DB.
type evdb struct {
	mu   sync.Mutex
	subs []*Subscription

	acqMu  sync.Mutex // serializes writers of acq
	acq    *lfTable[acqKey, *acqEntry]
	budget acqBudget // Options.AcquireRate
}

func (e *evdb) init(o *Options) {
	e.acq = newLFTable[acqKey, *acqEntry]()
	e.budget.init(o.AcquireRate)
}

// Subscribe returns a subscription whose channel buffers up to buffer
// events (at least 1). Events never wait for a slow subscriber: when its
// buffer is full they are dropped for it and counted.
func (db *DB) Subscribe(buffer int) *Subscription {
	s := &Subscription{db: db, ch: make(chan Event, max(buffer, 1))}
	e := &db.evdb
	e.mu.Lock()
	e.subs = append(e.subs, s)
	e.mu.Unlock()
	return s
}

// publish delivers ev to every subscriber without blocking.
func (db *DB) publish(ev Event) {
	e := &db.evdb
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.subs {
		select {
		case s.ch <- ev:
		default:
			s.dropped.Add(1)
			db.stats.eventsDropped.Add(1)
		}
	}
}

// Mapping reports that authentic packets of the inbound state s arrived
// from the address and port from, which differ from its peer (s.Peer()):
// a NAT mapping changed. It fires a mapping event at most once per
// Options.AcquireInterval for each state while the mapping stays changed,
// and reports whether it did. The data path calls it only for packets
// whose peer differs, which is rare: until the control plane updates the
// state.
func (db *DB) Mapping(s *SA, from netip.AddrPort) bool {
	now := db.mono()
	last := s.mappingAt.Load()
	if iv := int64(db.opts.AcquireInterval); last != 0 && now-last < iv {
		return false
	}
	if !s.mappingAt.CompareAndSwap(last, now) {
		return false
	}
	db.publish(Event{Kind: EventMapping, SPI: s.spi, Dst: s.params.Load().cfg.Dst, ReqID: s.reqid, Dir: s.dir,
		Time: db.wall(now), NewPeer: from})
	return true
}
