package sa

import (
	"sync/atomic"
	"time"

	"github.com/espd/espd/packet"
)

// DefaultAcquireRate is Options.AcquireRate's default: 100 acquire events
// a second over all policies and destinations.
const DefaultAcquireRate = 100

// acqKey is what the acquire rate limit counts: a policy and a
// destination.
type acqKey struct {
	index  uint32
	fam    uint8
	hi, lo uint64
}

func (k acqKey) hash(seed uint64) uint64 {
	h := mix64(seed ^ uint64(k.index)<<8 ^ uint64(k.fam))
	h = mix64(h ^ k.hi)
	return mix64(h ^ k.lo)
}

type acqEntry struct{ last atomic.Int64 } // mono() of the last acquire

// Acquire fires an acquire event for a protect policy that matched the
// flow while the policy's reqid had no state, and reports whether it did:
// at most one event per policy (by Index) and destination per
// Options.AcquireInterval, and at most Options.AcquireRate a second over
// all of them. An acquire the global limit holds back still starts its
// destination's interval. Every call that fires no event counts in
// GlobalStats.AcquiresSuppressed. The data path may call it for every
// such packet; the suppressed paths take no lock and do not allocate.
func (db *DB) Acquire(p Policy, f packet.Flow) bool {
	now := db.mono()
	if iv := int64(db.opts.AcquireInterval); iv > 0 {
		hi, lo, fam := addrBits(f.Dst)
		k := acqKey{index: p.Index, fam: fam, hi: hi, lo: lo}
		if !db.acquireDue(k, now, iv) {
			db.stats.acquiresSuppressed.Add(1)
			return false
		}
	}
	if !db.evdb.budget.take(now) {
		db.stats.acquiresSuppressed.Add(1)
		return false
	}
	db.stats.acquires.Add(1)
	db.publish(Event{Kind: EventAcquire, Dst: f.Dst, ReqID: p.ReqID, Dir: p.Dir, Time: db.wall(now), Policy: p, Flow: f})
	return true
}

// acqBudget is the global acquire limit, a token bucket of rate tokens
// refilled at rate a second, kept as GCRA keeps it: one atomic time, tat,
// by which the bucket is full again.
type acqBudget struct {
	step  int64 // ns a token takes to come back; 0: no limit
	depth int64 // step * rate: how far tat may run ahead of now
	tat   atomic.Int64
}

func (b *acqBudget) init(rate int) {
	if rate <= 0 {
		return
	}
	b.step = max(int64(time.Second)/int64(rate), 1)
	b.depth = b.step * int64(rate)
}

// take claims a token at now (a mono() time) and reports whether there
// was one.
func (b *acqBudget) take(now int64) bool {
	if b.step == 0 {
		return true
	}
	for {
		tat := b.tat.Load()
		next := max(tat, now) + b.step
		if next-now > b.depth {
			return false
		}
		if b.tat.CompareAndSwap(tat, next) {
			return true
		}
	}
}

// acquireDue claims the acquire for k at now if the last one is at least
// iv old.
func (db *DB) acquireDue(k acqKey, now, iv int64) bool {
	e := &db.evdb
	if ent, ok := e.acq.get(k); ok {
		if due, known := ent.claim(now, iv); known {
			return due
		}
	}
	e.acqMu.Lock()
	defer e.acqMu.Unlock()
	if ent, ok := e.acq.get(k); ok {
		due, _ := ent.claim(now, iv) // pruning holds acqMu: never pruned here
		return due
	}
	ent := &acqEntry{}
	ent.last.Store(now)
	e.acq.put(k, ent)
	return true
}

// acqPruned marks an entry that pruneAcquires removed.
const acqPruned = -1

// claim sets the entry's time to now if the last acquire is at least iv
// old, and reports whether it did; known is false if the entry was pruned
// (the caller must look again under acqMu).
func (a *acqEntry) claim(now, iv int64) (due, known bool) {
	for {
		last := a.last.Load()
		switch {
		case last == acqPruned:
			return false, false
		case now-last < iv:
			return false, true
		case a.last.CompareAndSwap(last, now):
			return true, true
		}
	}
}

// pruneAcquires forgets rate-limit entries older than the interval.
func (db *DB) pruneAcquires(now int64) {
	iv := int64(db.opts.AcquireInterval)
	e := &db.evdb
	e.acqMu.Lock()
	defer e.acqMu.Unlock()
	var old []acqKey
	e.acq.all(func(k acqKey, ent *acqEntry) bool {
		if last := ent.last.Load(); now-last >= iv && ent.last.CompareAndSwap(last, acqPruned) {
			old = append(old, k)
		}
		return true
	})
	for _, k := range old {
		e.acq.remove(k)
	}
}
