package sa

import "fmt"

// GlobalReason names a data-path counter that belongs to no state.
type GlobalReason uint8

// Global counters the data path updates with CountGlobal.
const (
	// GlobalInvalidSPI counts ESP packets whose SPI matches no inbound
	// state.
	GlobalInvalidSPI GlobalReason = iota
	// GlobalMalformed counts packets too broken to reach a state: bad IP
	// or UDP headers, truncated ESP.
	GlobalMalformed
	// GlobalPolicyDrop counts packets a drop policy discarded, or that an
	// inbound protect policy refused because they arrived in clear.
	GlobalPolicyDrop
	// GlobalNoState counts outbound packets a protect policy matched
	// while its reqid had no live state (they cause acquires).
	GlobalNoState
	// GlobalQueueDrop counts packets dropped because a queue was full.
	GlobalQueueDrop
	numGlobalReasons
)

var globalNames = [...]string{
	GlobalInvalidSPI: "invalid-spi",
	GlobalMalformed:  "malformed",
	GlobalPolicyDrop: "policy",
	GlobalNoState:    "no-state",
	GlobalQueueDrop:  "queue",
}

// String returns a short name such as "invalid-spi", fit for a metric
// label.
func (r GlobalReason) String() string {
	if r < numGlobalReasons {
		return globalNames[r]
	}
	return fmt.Sprintf("global(%d)", uint8(r))
}

// globalCounters are the DB-wide atomics, each on its own cache line.
type globalCounters struct {
	reasons            [numGlobalReasons]paddedCounter
	acquires           paddedCounter
	acquiresSuppressed paddedCounter
	eventsDropped      paddedCounter
}

// CountGlobal adds n to a global counter; the data path calls it once per
// batch. An out-of-range reason is ignored.
func (db *DB) CountGlobal(r GlobalReason, n uint64) {
	if r < numGlobalReasons {
		db.stats.reasons[r].Add(n)
	}
}

// GlobalStats is a snapshot of the DB-wide counters.
type GlobalStats struct {
	InvalidSPI, Malformed, PolicyDrops, NoState, QueueDrops uint64
	// Acquires counts acquire events fired; AcquiresSuppressed those the
	// rate limit held back.
	Acquires, AcquiresSuppressed uint64
	// EventsDropped counts events lost to full subscriber buffers.
	EventsDropped uint64
	// States, Larval and Policies count what is installed now.
	States, Larval, Policies int
	// Packets, Bytes and Drops sum the counters of every state, removed
	// ones included (up to their removal), so they only grow.
	Packets, Bytes uint64
	Drops          [NumDropReasons]uint64
}

// Stats returns a snapshot of the DB-wide counters.
func (db *DB) Stats() GlobalStats {
	g := GlobalStats{
		InvalidSPI:         db.stats.reasons[GlobalInvalidSPI].Load(),
		Malformed:          db.stats.reasons[GlobalMalformed].Load(),
		PolicyDrops:        db.stats.reasons[GlobalPolicyDrop].Load(),
		NoState:            db.stats.reasons[GlobalNoState].Load(),
		QueueDrops:         db.stats.reasons[GlobalQueueDrop].Load(),
		Acquires:           db.stats.acquires.Load(),
		AcquiresSuppressed: db.stats.acquiresSuppressed.Load(),
		EventsDropped:      db.stats.eventsDropped.Load(),
		Policies:           db.spdb.policyCount(),
	}
	d := &db.sadb
	d.mu.Lock()
	t := d.retired
	d.byKey.all(func(_ saKey, s *SA) bool { t.add(s); return true })
	g.States, g.Larval = d.byKey.len(), len(d.larval)
	d.mu.Unlock()
	g.Packets, g.Bytes, g.Drops = t.packets, t.bytes, t.drops
	return g
}

// totals sums state counters.
type totals struct {
	packets, bytes uint64
	drops          [NumDropReasons]uint64
}

func (t *totals) add(s *SA) {
	t.packets += s.packets.Load()
	t.bytes += s.bytes.Load()
	for i := range s.drops {
		t.drops[i] += s.drops[i].Load()
	}
}
