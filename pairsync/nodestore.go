package pairsync

import (
	"fmt"
	"time"

	"github.com/espd/espd/crypto"
)

// Resume is the store's: it includes what the ledger recorded of the
// other node's reservations, so a state installed on this node continues
// above them.
func (n *Node) Resume(fp crypto.Fingerprint, negotiated bool) (uint64, error) {
	v, err := n.cfg.Store.Resume(fp, negotiated)
	if err == nil && v > 0 {
		n.mu.Lock()
		n.reserved[fp] = max(n.reserved[fp], v)
		n.mu.Unlock()
	}
	return v, err
}

// Reserve records the reservation in the store; while the node is active
// it then tells the standby and returns only once the standby acknowledged
// it, or once the lease rule lets it go unacknowledged (L·1.1 after the
// standby was last heard before the reservation: doc.go). A standby's
// reservations are not sent: its states hand out no numbers.
func (n *Node) Reserve(fp crypto.Fingerprint, limit uint64) error {
	return n.ReserveBatch([]crypto.Fingerprint{fp}, []uint64{limit})
}

// Batcher is a Store that records many reservations with one durable
// write (seqstore.Store); ReserveBatch uses it when the Store is one.
type Batcher interface {
	ReserveBatch(fps []crypto.Fingerprint, limits []uint64) error
}

// ReserveBatch is Reserve for many keys at once (sa.SeqBatcher): one
// store write if the Store is a Batcher, and one wait for the standby's
// acknowledgements or the lease.
func (n *Node) ReserveBatch(fps []crypto.Fingerprint, limits []uint64) error {
	if len(fps) != len(limits) {
		return fmt.Errorf("pairsync: %d keys and %d limits", len(fps), len(limits))
	}
	if b, ok := n.cfg.Store.(Batcher); ok && len(fps) > 1 {
		if err := b.ReserveBatch(fps, limits); err != nil {
			return err
		}
	} else {
		for i, fp := range fps {
			if err := n.cfg.Store.Reserve(fp, limits[i]); err != nil {
				return err
			}
		}
	}
	n.mu.Lock()
	for i, fp := range fps {
		n.reserved[fp] = max(n.reserved[fp], limits[i])
	}
	active := n.role == RoleActive
	// Every message that did not carry the limits echoes a stamp heard by
	// now: at deadline the standby holds none of them fresh.
	deadline := n.lastHeard + n.leaseWait()
	n.mu.Unlock()
	if !active {
		return nil
	}
	return n.await(fps, limits, deadline)
}

// await sends the reservations until the standby acknowledges every
// limit or the deadline of the lease passes.
func (n *Node) await(fps []crypto.Fingerprint, limits []uint64, deadline time.Duration) error {
	retry := max(n.cfg.Interval/5, 10*time.Millisecond)
	sent := false
	for {
		n.mu.Lock()
		var rs []Reservation
		for i, fp := range fps {
			if n.acked[fp] < limits[i] {
				rs = append(rs, Reservation{fp, n.reserved[fp]})
			}
		}
		switch {
		case n.closed:
			n.mu.Unlock()
			return ErrClosed
		case len(rs) == 0:
			if sent {
				n.stats.AckWaits++
			}
			n.mu.Unlock()
			return nil
		case n.now() >= deadline:
			n.stats.LeaseWaits++
			n.mu.Unlock()
			return nil
		}
		var msgs []*Message
		for len(rs) > 0 {
			k := min(len(rs), maxRecords)
			msgs = append(msgs, n.encodeLocked(&Message{Type: TypeReserve, Reservations: rs[:k]}))
			rs = rs[k:]
		}
		wait := min(retry, deadline-n.now())
		ch := n.changed
		n.mu.Unlock()
		for _, m := range msgs {
			n.send(m)
		}
		sent = true
		t := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
}

// leaseWait is how long after the standby was last heard an active node
// uses a reservation it has not acknowledged: L and a tenth for the two
// clocks' drift.
func (n *Node) leaseWait() time.Duration { return n.cfg.Lease + n.cfg.Lease/10 }

// Retire is the store's; the key is no longer carried.
func (n *Node) Retire(fp crypto.Fingerprint, last uint64) error {
	err := n.cfg.Store.Retire(fp, last)
	n.mu.Lock()
	delete(n.reserved, fp)
	delete(n.acked, fp)
	n.mu.Unlock()
	return err
}

// Inbound is the store's.
func (n *Node) Inbound(fp crypto.Fingerprint, negotiated bool) error {
	return n.cfg.Store.Inbound(fp, negotiated)
}

// RetireInbound is the store's.
func (n *Node) RetireInbound(fp crypto.Fingerprint) error { return n.cfg.Store.RetireInbound(fp) }

// Used is the store's.
func (n *Node) Used(fp crypto.Fingerprint) (out, in bool, err error) { return n.cfg.Store.Used(fp) }
