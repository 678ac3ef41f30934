package pairsync

import "time"

// The replay rule. An epoch names a run of a node: the wall-clock time
// at which it started, in nanoseconds, so that a node restarted later
// has a higher epoch. A node accepts, of the other node's authentic
// messages, only those of its current epoch whose Counter is above the
// highest accepted, or those of a higher epoch (the other node
// restarted), which then becomes the current one. So a message sent back
// to the other node again (a replay), or overtaken by a later one
// (reordered, delayed), is dropped and counted (Stats.Replayed); so is a
// message of any earlier run, however old. Nothing is lost: every
// report is absolute and swept again every interval, and a Reserve is
// resent until acknowledged.
//
// One exception keeps a pair working when the other node's clock went
// back across its restart (its new epoch is lower): once its current
// epoch has been silent for two leases, a lower epoch is taken. A replay
// of an earlier run's messages can then be accepted, once per message,
// while the other node is down; it makes nothing fresh or acknowledged
// (both need an echo of this node's own run and clock, doc.go) and, as
// an accepted message only moves lastHeard forward, it can only make an
// active wait longer for a lease (at most the lease and a tenth per
// reservation).

// newEpoch returns the epoch of a run started at start.
func newEpoch(start time.Time) uint64 { return max(uint64(start.UnixNano()), 1) }

// acceptLocked applies the replay rule to m, an authentic message of the
// other node received at now. If m is accepted the node hears it: its
// stamp is the one to echo and, if it is a standby's message (Hello,
// Ack, Own), lastHeard moves to now (doc.go).
func (n *Node) acceptLocked(m *Message, now time.Duration) bool {
	switch {
	case m.Epoch == n.peerEpoch:
		if m.Counter <= n.peerCounter {
			return false
		}
		n.peerStamp = max(n.peerStamp, m.Stamp)
	case m.Epoch < n.peerEpoch && now-n.heardAt < 2*n.cfg.Lease:
		return false
	default:
		n.peerEpoch, n.peerStamp = m.Epoch, m.Stamp
	}
	n.peerCounter = m.Counter
	n.heardAt = now
	if m.Type.fromStandby() {
		n.lastHeard = now
	}
	return true
}

// fromStandby reports whether a node sends messages of type t only while
// it stands by: those whose stamps can make a report fresh there.
func (t Type) fromStandby() bool { return t == TypeHello || t == TypeAck || t == TypeOwn }
