package dataplane

import "github.com/espd/espd/sa"

// accounting adds a batch's per-state packets, bytes and drops to the
// states, one call per run of consecutive packets of a state.
type accounting struct {
	s              *sa.SA
	packets, bytes uint64

	ds     *sa.SA
	reason sa.DropReason
	drops  uint64
}

func (a *accounting) add(s *sa.SA, bytes int) {
	if s != a.s {
		a.flushAccount()
		a.s = s
	}
	a.packets++
	a.bytes += uint64(bytes)
}

func (a *accounting) drop(s *sa.SA, r sa.DropReason) {
	if s != a.ds || r != a.reason {
		a.flushDrops()
		a.ds, a.reason = s, r
	}
	a.drops++
}

func (a *accounting) flushAccount() {
	if a.s != nil && a.packets > 0 {
		a.s.Account(a.packets, a.bytes)
	}
	a.s, a.packets, a.bytes = nil, 0, 0
}

func (a *accounting) flushDrops() {
	if a.ds != nil && a.drops > 0 {
		a.ds.Drop(a.reason, a.drops)
	}
	a.ds, a.drops = nil, 0
}

// flush adds what is pending; call it at the end of each batch.
func (a *accounting) flush() {
	a.flushAccount()
	a.flushDrops()
}

// passes reports whether the in-order stage sends or writes e. Otherwise
// it counts e's drop on its state with its reason (a drop that the reader
// already counted, dropCounted, is only skipped).
func (a *accounting) passes(e *elem) bool {
	switch e.drop {
	case pass:
		return true
	case dropSA:
		a.drop(e.sa, e.reason)
	}
	return false
}
