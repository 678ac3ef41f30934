package control

import (
	"fmt"
	"time"
)

// The control socket cannot be locked out: a newcomer at MaxConns is
// admitted by closing another connection. The one closed belongs to the
// peer uid that holds the most connections, so that a flood from one user
// (a group member's runaway script) only ever costs that user connections
// while it holds any, and root's (charon's plugin, espctl) stay. Within
// that uid it is one that neither subscribes to events nor is registered
// for the IKE hand-off if there is one (charon's plugin holds one of each
// and must not lose them to its own request connection's reconnect), then
// one waiting between messages rather than in the middle of one, then the
// least recently active.

// evictBefore reports whether a should be evicted before b; count is the
// number of connections of each peer uid.
func evictBefore(a, b *conn, count map[uint32]int) bool {
	if ca, cb := count[a.cred.Uid], count[b.cred.Uid]; ca != cb {
		return ca > cb
	}
	if pa, pb := a.pinned(), b.pinned(); pa != pb {
		return !pa
	}
	if wa, wb := a.waiting.Load(), b.waiting.Load(); wa != wb {
		return wa
	}
	return a.lastActive.Load() < b.lastActive.Load()
}

// evictLocked closes a connection to make room for the newcomer nc and
// returns the log line to write (empty while the log is rate-limited).
// s.mu is held.
func (s *Server) evictLocked(nc *conn) string {
	count := map[uint32]int{}
	for c := range s.conns {
		if !c.evicted.Load() {
			count[c.cred.Uid]++
		}
	}
	var victim *conn
	for c := range s.conns {
		if c.evicted.Load() {
			continue
		}
		if victim == nil || evictBefore(c, victim, count) {
			victim = c
		}
	}
	if victim == nil {
		return ""
	}
	idle := time.Duration(time.Now().UnixNano() - victim.lastActive.Load()).Round(time.Millisecond)
	what := fmt.Sprintf("pid %d uid %d (idle %v, one of uid %d's %d connections", victim.cred.Pid, victim.cred.Uid, idle, victim.cred.Uid, count[victim.cred.Uid])
	switch {
	case victim.pinned():
		what += ", subscribed or registered for IKE"
	case !victim.waiting.Load():
		what += ", in the middle of a message"
	}
	what += ")"

	victim.evicted.Store(true)
	s.evicting++
	s.evicted.Add(1)
	// Shutting the read side wakes the serving goroutine, which finishes
	// the request it may be answering, sends the EAGAIN ERROR and closes
	// (readFailed); the slot is free now.
	victim.nc.CloseRead()
	return s.evictLog.report(time.Now(), fmt.Sprintf("control: connection limit of %d reached: closed the connection of %s to admit pid %d uid %d",
		s.cfg.MaxConns, what, nc.cred.Pid, nc.cred.Uid))
}

// evictLog rate-limits the eviction log lines to one per EvictLogInterval.
type evictLog struct {
	last   time.Time
	missed int // evictions since the last line
}

// report returns line, with a count of the evictions not logged since the
// previous one, or "" when a line was written less than EvictLogInterval
// ago.
func (l *evictLog) report(now time.Time, line string) string {
	if !l.last.IsZero() && now.Sub(l.last) < EvictLogInterval {
		l.missed++
		return ""
	}
	if l.missed > 0 {
		line += fmt.Sprintf(" (and %d more not logged in the last %v)", l.missed, now.Sub(l.last).Round(time.Second))
	}
	l.last, l.missed = now, 0
	return line
}
