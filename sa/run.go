package sa

import (
	"context"
	"time"
)

// Run enforces the time lifetimes until ctx is done: every
// Options.TickInterval it soft- or hard-expires the states past their
// add-time or use-time limits (and any byte or packet limit that UpdateSA
// lowered below the counters), expires SPI reservations and forgets stale
// acquire rate-limit entries.
func (db *DB) Run(ctx context.Context) {
	t := time.NewTicker(db.opts.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			db.tick()
		}
	}
}

type expiry struct {
	s    *SA
	hard bool
	r    ExpireReason
}

// tick does one round of Run's work at the clock's current time.
func (db *DB) tick() {
	now := db.mono()
	var due []expiry
	d := &db.sadb
	d.mu.Lock()
	bp := statesPool.Get().(*[]*SA)
	ss := d.snapshotInstalled((*bp)[:0])
	db.expireReservations(now)
	d.mu.Unlock()
	// The states are checked without the lock, which AddSA and DeleteSA
	// take: one removed meanwhile is dead, and hardExpire and softExpire
	// do nothing to a dead state.
	for _, s := range ss {
		if e, ok := s.expiryAt(now); ok {
			due = append(due, e)
		}
	}
	clear(ss)
	*bp = ss[:0]
	statesPool.Put(bp)
	for _, e := range due {
		if e.hard {
			db.hardExpire(e.s, e.r)
		} else {
			db.softExpire(e.s, e.r)
		}
	}
	if db.opts.AcquireInterval > 0 {
		db.pruneAcquires(now)
	}
}

// expiryAt returns the expiry that is due for s at now, hard first.
func (s *SA) expiryAt(now int64) (expiry, bool) {
	p := s.params.Load()
	np, nb, used := s.packets.Load(), s.bytes.Load(), s.firstUse.Load()
	if r, ok := p.cfg.Hard.elapsed(now, s.addTime, used); ok {
		return expiry{s, true, r}, true
	}
	if r, ok := p.cfg.Hard.reached(np, nb); ok {
		return expiry{s, true, r}, true
	}
	if s.State() != StateValid {
		return expiry{}, false
	}
	if r, ok := p.cfg.Soft.elapsed(now, s.addTime, used); ok {
		return expiry{s, false, r}, true
	}
	if r, ok := p.cfg.Soft.reached(np, nb); ok {
		return expiry{s, false, r}, true
	}
	return expiry{}, false
}
