package conn

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// LogLimit rate-limits a log line that what arrives from the network can
// trigger (a datagram, a packet, a failing socket): Warn logs at most one
// line per Every and adds to it "suppressed", the number of lines held
// back since the previous one. The zero value logs at most once a second.
// It is safe for concurrent use; a held-back line costs a few atomic
// operations and takes no lock. It must not be copied after first use.
type LogLimit struct {
	// Every is the least time between two lines; 0 means a second.
	Every time.Duration
	// Now is the clock; nil means time.Now. Tests inject a fake one.
	Now func() time.Time

	last       atomic.Int64 // Now().UnixNano() of the last line; 0: none yet
	suppressed atomic.Uint64
}

// Warn logs msg and args, with "suppressed" appended, on l at level Warn
// if the last line is at least Every old, and reports whether it did;
// otherwise it counts the line as suppressed.
func (ll *LogLimit) Warn(l *slog.Logger, msg string, args ...any) bool {
	n, ok := ll.allow()
	if ok {
		l.Warn(msg, append(args[:len(args):len(args)], "suppressed", n)...)
	}
	return ok
}

// allow claims the next line, returning how many were suppressed before
// it, or counts a suppressed one.
func (ll *LogLimit) allow() (uint64, bool) {
	every, now := ll.Every, time.Now
	if every <= 0 {
		every = time.Second
	}
	if ll.Now != nil {
		now = ll.Now
	}
	t := now().UnixNano()
	last := ll.last.Load()
	if last != 0 && t-last < int64(every) || !ll.last.CompareAndSwap(last, t) {
		ll.suppressed.Add(1)
		return 0, false
	}
	return ll.suppressed.Swap(0), true
}
