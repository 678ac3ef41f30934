package sa

import "sync"

// globalCounters are the DB-wide atomics, each on its own cache line.
type globalCounters struct {
	acquires           paddedCounter
	acquiresSuppressed paddedCounter
	eventsDropped      paddedCounter
}

// GlobalStats is a snapshot of the DB-wide counters: what the DB itself
// counts, and the sums of the states' counters. What the data path drops
// before a packet reaches a state (invalid SPI, malformed, policy, no
// state, full queues) is counted by the data path (dataplane.Stats), not
// here.
type GlobalStats struct {
	// Acquires counts the acquire events Acquire published;
	// AcquiresSuppressed the calls of Acquire that a rate limit held
	// back: the one per policy and destination (Options.AcquireInterval)
	// or the global one (Options.AcquireRate).
	Acquires, AcquiresSuppressed uint64
	// EventsDropped counts events not delivered to a subscriber because
	// its buffer was full (one per event and subscriber).
	EventsDropped uint64
	// States counts the installed states, Larval the SPI reservations
	// (AllocSPI) not yet turned into states, Policies the installed
	// policies.
	States, Larval, Policies int
	// Packets, Bytes and Drops sum the counters of every state, removed
	// ones included (with what a batch that held one counted on it after
	// its removal: foldLate), so they only grow.
	Packets, Bytes uint64
	Drops          [NumDropReasons]uint64
}

// Stats returns a snapshot of the DB-wide counters. It holds the state
// lock only to copy the list of installed states and the removed states'
// totals, and sums the states' counters after releasing it: AddSA,
// DeleteSA and the data path's expiries do not wait for the sum (100,000
// states take milliseconds). The sums never go down from one call to
// the next (statsOf).
func (db *DB) Stats() GlobalStats {
	g := GlobalStats{
		Acquires:           db.stats.acquires.Load(),
		AcquiresSuppressed: db.stats.acquiresSuppressed.Load(),
		EventsDropped:      db.stats.eventsDropped.Load(),
		Policies:           db.spdb.policyCount(),
	}
	bp := statesPool.Get().(*[]*SA)
	d := &db.sadb
	d.mu.Lock()
	t := d.retired
	ss := d.snapshotInstalled((*bp)[:0])
	g.States, g.Larval = len(ss), len(d.larval)
	d.mu.Unlock()
	if statsCopied != nil {
		statsCopied()
	}
	for _, s := range ss {
		st := s.statsOf()
		t.addTotals(&st)
	}
	clear(ss) // keep no state alive from the pool
	*bp = ss[:0]
	statesPool.Put(bp)
	g.Packets, g.Bytes, g.Drops = t.packets, t.bytes, t.drops
	return g
}

// statsCopied, if set (tests), runs in Stats between the copy of the
// installed list and the sum.
var statsCopied func()

// statesPool holds the buffers Stats and tick copy the installed list
// into.
var statesPool = sync.Pool{New: func() any { return new([]*SA) }}

// statsOf returns what Stats counts for s, a state that was installed
// when Stats copied the list: its counters now if it is still
// installed, else the counters its removal added to the removed states'
// totals (which the next Stats has, and which were read after s was
// marked dead), with what foldLate added since. Reading the counters before the state makes this
// monotonic: a state found alive was marked dead, if at all, after its
// counters were read here, so its removal reads at least as much.
func (s *SA) statsOf() totals {
	var t totals
	t.add(s)
	if s.State() != StateDead {
		return t
	}
	if f := s.final.Load(); f != nil {
		return *f
	}
	// Marked dead, its removal still under way: it publishes final
	// before it releases the lock.
	d := &s.db.sadb
	d.mu.Lock()
	f := s.final.Load()
	d.mu.Unlock()
	return *f
}

// foldLate adds to the removed states' totals what the data path counted
// on s after its removal read its counters (a batch that still had s when
// it was removed counts it afterwards: the packet that took its last
// sequence number, the packets dropped behind it), and moves final up to
// the counters now. Account and Drop call it when they find s dead, after
// adding: an addition that removal did not read is followed by a check
// that sees the state dead (removal marks it dead before reading), and
// under sadb.mu only the part not folded yet is added, so each count
// reaches the totals once.
func (s *SA) foldLate() {
	d := &s.db.sadb
	d.mu.Lock()
	defer d.mu.Unlock()
	f := s.final.Load()
	if f == nil { // dead without removal: an SPI reservation, never counted on
		return
	}
	now := new(totals)
	now.add(s)
	delta := totals{packets: now.packets - f.packets, bytes: now.bytes - f.bytes}
	for i := range delta.drops {
		delta.drops[i] = now.drops[i] - f.drops[i]
	}
	d.retired.addTotals(&delta)
	s.final.Store(now)
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

func (t *totals) addTotals(o *totals) {
	t.packets += o.packets
	t.bytes += o.bytes
	for i := range o.drops {
		t.drops[i] += o.drops[i]
	}
}
