package sa

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
	// AcquiresSuppressed the calls of Acquire that the rate limit
	// (Options.AcquireInterval) held back.
	Acquires, AcquiresSuppressed uint64
	// EventsDropped counts events not delivered to a subscriber because
	// its buffer was full (one per event and subscriber).
	EventsDropped uint64
	// States counts the installed states, Larval the SPI reservations
	// (AllocSPI) not yet turned into states, Policies the installed
	// policies.
	States, Larval, Policies int
	// Packets, Bytes and Drops sum the counters of every state, removed
	// ones included (up to their removal), so they only grow.
	Packets, Bytes uint64
	Drops          [NumDropReasons]uint64
}

// Stats returns a snapshot of the DB-wide counters.
func (db *DB) Stats() GlobalStats {
	g := GlobalStats{
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
