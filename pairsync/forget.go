package pairsync

import (
	"time"

	"github.com/espd/espd/crypto"
)

// Bounded state. The active sweeps every live key's reservation (and
// every live inbound key's window) each interval, and a standby its own
// reservations; so a key of the other node that no message has carried
// for forgetAfter, while the other node was heard, is gone there. The
// node then forgets it: its ledger entries, its fresh stamps, and its
// record in the store becomes a retired one that expires as a negotiated
// key's does (PeerRecorder). Forgetting is safe whenever it happens:
// a report older than the lease is not fresh anyway, so a takeover
// leaves such a key silent (and has it rekeyed) whether or not it is
// remembered, and the other node's numbers are in its own blocks, which
// this node never uses. This node's own keys (reserved, acked) go with
// their last state (Retire).

// forgetAfter is how long a key must have been absent from the other
// node's reports, while it was heard, before this node forgets it.
func (n *Node) forgetAfter() time.Duration { return 3 * n.cfg.Lease }

// forgetLocked forgets, in memory, the keys of the other node absent
// for forgetAfter, and returns them: the caller, n.mu released, has the
// ledger forget them too (forget), which writes to the store. Called
// every half interval.
func (n *Node) forgetLocked() []crypto.Fingerprint {
	limit := n.forgetAfter()
	var gone []crypto.Fingerprint
	for fp, at := range n.seen {
		if n.heardAt-at <= limit {
			continue
		}
		delete(n.seen, fp)
		delete(n.fresh, fp)
		delete(n.winFresh, fp)
		n.stats.Forgotten++
		gone = append(gone, fp)
	}
	return gone
}

// forget has the ledger forget the keys forgetLocked returned.
func (n *Node) forget(gone []crypto.Fingerprint) {
	for _, fp := range gone {
		if err := n.ledger.Forget(fp); err != nil {
			n.log.Warn("pair link: cannot retire the other node's record of a key it no longer reports", "err", err)
		}
	}
}

// Keys returns how many keys of the other node the Node and its Ledger
// hold: what Stats cannot show and a churn must bring back down.
func (n *Node) Keys() (seen, fresh, windowsFresh, reserved, windows int) {
	n.mu.Lock()
	seen, fresh, windowsFresh = len(n.seen), len(n.fresh), len(n.winFresh)
	n.mu.Unlock()
	reserved, windows = n.ledger.Len()
	return
}
