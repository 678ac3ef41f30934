package pairsync

import (
	"context"
	"errors"
	"net"
	"time"
)

// Run serves the node until ctx is done or Close: it receives the other
// node's messages, and every Interval/2 it says hello (standby) or, every
// Interval, sweeps all reservations and windows (active).
func (n *Node) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			n.Close()
		case <-done:
		}
	}()
	defer close(done)
	go n.ticker(ctx)
	buf := make([]byte, MaxMessage+1)
	for {
		nb, _, err := n.cfg.Conn.ReadFrom(buf)
		if err != nil {
			n.mu.Lock()
			closed := n.closed
			n.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			n.log.Warn("pair link: receive", "err", err)
			continue
		}
		n.receive(buf[:nb])
	}
}

// ticker drives hellos and sweeps until ctx is done or the node closes.
func (n *Node) ticker(ctx context.Context) {
	t := time.NewTicker(n.cfg.Interval / 2)
	defer t.Stop()
	odd := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.mu.Lock()
		closed := n.closed
		n.mu.Unlock()
		if closed {
			return
		}
		odd = !odd
		n.tick(odd)
	}
}

// tick sends a standby's hello, or (sweep) an active's reservations and
// windows.
func (n *Node) tick(sweep bool) {
	n.mu.Lock()
	var msgs [][]byte
	switch n.role {
	case RoleStandby:
		if !n.recordErr {
			msgs = append(msgs, n.encodeLocked(&Message{Type: TypeHello}))
			if sweep {
				msgs = append(msgs, n.sweepReservationsLocked(TypeOwn)...)
			}
		}
	case RoleActive:
		if sweep {
			msgs = n.sweepReservationsLocked(TypeReserve)
		}
	}
	active := n.role == RoleActive
	n.mu.Unlock()
	if active && sweep && n.cfg.Windows != nil {
		msgs = append(msgs, n.windowMessages(n.cfg.Windows())...)
	}
	for _, b := range msgs {
		n.send(b)
	}
}

// maxRecords is how many reservations fit one message.
const maxRecords = (MaxMessage - headerLen - 16 - macLen) / reserveLen

// sweepReservationsLocked encodes every reservation in messages of type
// t, each carrying a key's current one.
func (n *Node) sweepReservationsLocked(t Type) [][]byte {
	var out [][]byte
	rs := make([]Reservation, 0, min(len(n.reserved), maxRecords))
	for fp, lim := range n.reserved {
		rs = append(rs, Reservation{fp, lim})
		if len(rs) == maxRecords {
			out = append(out, n.encodeLocked(&Message{Type: t, Reservations: rs}))
			rs = rs[:0]
		}
	}
	if len(rs) > 0 || (len(out) == 0 && t == TypeReserve) {
		out = append(out, n.encodeLocked(&Message{Type: t, Reservations: rs}))
	}
	return out
}

// windowMessages encodes ws in as few messages as fit.
func (n *Node) windowMessages(ws []Window) [][]byte {
	var out [][]byte
	size := headerLen + macLen
	var cur []Window
	flush := func() {
		if len(cur) > 0 {
			n.mu.Lock()
			out = append(out, n.encodeLocked(&Message{Type: TypeWindows, Windows: cur}))
			n.mu.Unlock()
		}
		cur, size = nil, headerLen+macLen
	}
	for _, w := range ws {
		if len(w.Bitmap) > MaxBitmap {
			w.Bitmap = w.Bitmap[:MaxBitmap]
		}
		l := len(w.FP) + 10 + len(w.Bitmap)
		if size+l > MaxMessage || len(cur) == 0xffff {
			flush()
		}
		cur = append(cur, w)
		size += l
	}
	flush()
	return out
}

// encodeLocked numbers, stamps and authenticates m; nil if it cannot be
// encoded (a bug: the callers keep to MaxMessage).
func (n *Node) encodeLocked(m *Message) []byte {
	n.counter++
	m.Epoch, m.Counter, m.Stamp = n.epoch, n.counter, uint64(n.now())
	m.PeerEpoch, m.Echo = n.peerEpoch, n.peerStamp
	b, err := m.Append(nil, &n.cfg.Key)
	if err != nil {
		n.log.Error("pair link: encoding a message", "type", m.Type, "err", err)
		return nil
	}
	n.stats.Sent[typeIndex(m.Type)]++
	n.stats.SentBytes += uint64(len(b))
	return b
}

// send sends b to the other node.
func (n *Node) send(b []byte) {
	if b == nil {
		return
	}
	if _, err := n.cfg.Conn.WriteTo(b, n.cfg.Peer); err != nil {
		n.mu.Lock()
		n.stats.SendErrors++
		closed := n.closed
		n.mu.Unlock()
		if !closed {
			n.log.Debug("pair link: send", "err", err)
		}
	}
}

func typeIndex(t Type) int {
	if t >= TypeReserve && t <= TypeOwn {
		return int(t)
	}
	return 0
}

// receive handles one datagram.
func (n *Node) receive(b []byte) {
	m, err := Decode(b, &n.cfg.Key)
	n.mu.Lock()
	if err != nil {
		n.stats.Rejected++
		n.mu.Unlock()
		n.log.Debug("pair link: message refused", "err", err)
		return
	}
	n.stats.Received[typeIndex(m.Type)]++
	n.stats.RecvBytes += uint64(len(b))
	now := n.now()
	n.heardAt = now
	if m.Epoch != n.peerEpoch {
		n.peerEpoch, n.peerStamp = m.Epoch, m.Stamp
	} else {
		n.peerStamp = max(n.peerStamp, m.Stamp)
	}
	switch m.Type {
	case TypeHello:
		n.lastHeard = now
		n.broadcastLocked()
		n.mu.Unlock()
	case TypeAck:
		n.lastHeard = now
		if m.AckEpoch == n.epoch {
			for _, r := range m.Reservations {
				n.acked[r.FP] = max(n.acked[r.FP], r.Limit)
			}
		}
		n.broadcastLocked()
		n.mu.Unlock()
	case TypeOwn:
		// A standby's own record: what the other node may have sent
		// itself. Fresh for a takeover as the active's reports are.
		standbySince, standby := n.standbySince, n.role == RoleStandby
		n.mu.Unlock()
		if standby {
			n.standbyApply(&m, standbySince)
		} else if err := n.ledger.Apply(&m); err != nil {
			n.log.Error("pair link: cannot record the standby's reservations", "err", err)
		}
	case TypeReserve, TypeWindows:
		if n.role != RoleStandby {
			n.stats.SplitBrain++
			warn := n.splitWarned == 0 || now-n.splitWarned > 10*time.Second
			if warn {
				n.splitWarned = now
			}
			n.mu.Unlock()
			if warn {
				n.log.Warn("pair link: the other node acts as active too (split brain): each keeps to its own sequence blocks, so no number repeats, and continues above the other's reports; the VRRP configuration decides which one carries the traffic")
			}
			n.followPeer(&m)
			return
		}
		standbySince := n.standbySince
		n.mu.Unlock()
		n.standbyApply(&m, standbySince)
	default:
		n.mu.Unlock()
	}
}

// standbyApply records an active's report, makes its keys fresh and
// acknowledges a Reserve.
func (n *Node) standbyApply(m *Message, standbySince uint64) {
	if err := n.ledger.Apply(m); err != nil {
		n.mu.Lock()
		n.stats.RecordErrors++
		n.recordErr = true
		n.mu.Unlock()
		n.log.Error("pair link: cannot record the active's report: this node stops answering, so that the active does not count on it", "err", err)
		return
	}
	if m.Type == TypeWindows {
		if n.cfg.OnWindows != nil {
			n.cfg.OnWindows(m.Windows)
		}
		return
	}
	n.mu.Lock()
	n.recordErr = false
	if n.role == RoleStandby && m.PeerEpoch == n.epoch && m.Echo >= standbySince && standbySince == n.standbySince {
		for _, r := range m.Reservations {
			n.fresh[r.FP] = max(n.fresh[r.FP], m.Echo)
		}
	}
	if m.Type != TypeReserve {
		n.mu.Unlock()
		return
	}
	b := n.encodeLocked(&Message{Type: TypeAck, AckEpoch: m.Epoch, AckCounter: m.Counter, Reservations: m.Reservations})
	n.mu.Unlock()
	n.send(b)
}

// followPeer records an active peer's reservations and hands them to
// OnPeerActive.
func (n *Node) followPeer(m *Message) {
	if m.Type != TypeReserve || len(m.Reservations) == 0 {
		return
	}
	if err := n.ledger.Apply(m); err != nil {
		n.mu.Lock()
		n.stats.RecordErrors++
		n.mu.Unlock()
		n.log.Error("pair link: cannot record the other active node's reservations", "err", err)
		return
	}
	if n.cfg.OnPeerActive != nil {
		n.cfg.OnPeerActive(m.Reservations)
	}
}
