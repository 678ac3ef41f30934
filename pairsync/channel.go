package pairsync

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/espd/espd/crypto"
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
		nb, from, err := n.cfg.Conn.ReadFrom(buf)
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
		if ap, ok := addrPort(from); !ok || ap != n.peer {
			n.mu.Lock()
			n.stats.Rejected++
			n.mu.Unlock()
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
	var msgs []*Message
	gone := n.forgetLocked()
	switch n.role {
	case RoleStandby:
		msgs = append(msgs, n.encodeLocked(&Message{Type: TypeHello}))
		if sweep {
			msgs = append(msgs, n.sweepReservationsLocked(TypeOwn)...)
		}
	case RoleActive:
		if sweep {
			msgs = n.sweepReservationsLocked(TypeReserve)
		}
	}
	active := n.role == RoleActive
	n.mu.Unlock()
	n.forget(gone)
	if active && sweep && n.cfg.Windows != nil {
		msgs = append(msgs, n.windowMessages(n.cfg.Windows())...)
	}
	for _, m := range msgs {
		n.send(m)
	}
}

// maxRecords is how many reservations fit one message.
const maxRecords = (MaxMessage - headerLen - MaxLocals*localLen - 16 - macLen) / reserveLen

// sweepReservationsLocked encodes every reservation in messages of type
// t, each carrying a key's current one.
func (n *Node) sweepReservationsLocked(t Type) []*Message {
	var out []*Message
	rs := make([]Reservation, 0, min(len(n.reserved), maxRecords))
	for fp, lim := range n.reserved {
		rs = append(rs, Reservation{fp, lim})
		if len(rs) == maxRecords {
			out = append(out, n.encodeLocked(&Message{Type: t, Reservations: rs}))
			rs = make([]Reservation, 0, min(len(n.reserved)-len(out)*maxRecords, maxRecords))
		}
	}
	if len(rs) > 0 || (len(out) == 0 && t == TypeReserve) {
		out = append(out, n.encodeLocked(&Message{Type: t, Reservations: rs}))
	}
	return out
}

// windowMessages encodes ws in as few messages as fit.
func (n *Node) windowMessages(ws []Window) []*Message {
	var out []*Message
	base := headerLen + len(n.cfg.Locals)*localLen + macLen
	size := base
	var cur []Window
	flush := func() {
		if len(cur) > 0 {
			n.mu.Lock()
			out = append(out, n.encodeLocked(&Message{Type: TypeWindows, Windows: cur}))
			n.mu.Unlock()
		}
		cur, size = nil, base
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

// encodeLocked stamps m and gives it what every message carries: the
// echo and the reports it carries are read together, under n.mu (the
// lease's rule, doc.go). send numbers and authenticates it.
func (n *Node) encodeLocked(m *Message) *Message {
	m.Epoch, m.Stamp = n.epoch, uint64(n.now())
	m.PeerEpoch, m.Echo = n.peerEpoch, n.peerStamp
	m.Node, m.Params, m.Locals = uint8(n.cfg.Node), n.digest, n.cfg.Locals
	return m
}

// send numbers m, authenticates it and sends it to the other node. The
// number is taken as it is sent, under sendMu, so that messages leave in
// the order of their counters (the receiver drops one below a counter it
// accepted: replay.go). Called without n.mu.
func (n *Node) send(m *Message) {
	n.sendMu.Lock()
	defer n.sendMu.Unlock()
	n.counter++
	m.Counter = n.counter
	b, err := m.Append(n.sendBuf[:0], &n.sendKey)
	if err != nil { // a bug: the callers keep to MaxMessage
		n.log.Error("pair link: encoding a message", "type", m.Type, "err", err)
		return
	}
	n.sendBuf = b
	n.mu.Lock()
	n.stats.Sent[typeIndex(m.Type)]++
	n.stats.SentBytes += uint64(len(b))
	n.mu.Unlock()
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

// receive handles one datagram of the other node's address: it drops
// and counts what is not authentic under the other node's key, what
// disagrees with this node's configuration (checkPeer) and what is not
// newer than what was accepted (acceptLocked), then applies the rest.
func (n *Node) receive(b []byte) {
	m, err := Decode(b, &n.recvKey)
	if err != nil {
		n.refuse(b, err)
		return
	}
	n.mu.Lock()
	if why := n.checkPeer(&m); why != "" {
		n.stats.Misconfigured++
		n.misHeard = max(n.now(), 1)
		warn := n.warnLocked(&n.misWarned)
		n.mu.Unlock()
		if warn {
			n.log.Error("pair link: refusing the other node: "+why, "node", n.cfg.Node)
		}
		return
	}
	now := n.now()
	if !n.acceptLocked(&m, now) {
		n.stats.Replayed++
		n.mu.Unlock()
		return
	}
	n.stats.Received[typeIndex(m.Type)]++
	n.stats.RecvBytes += uint64(len(b))
	switch m.Type {
	case TypeHello:
		n.broadcastLocked()
		n.mu.Unlock()
	case TypeAck:
		if m.AckEpoch == n.epoch {
			for _, r := range m.Reservations {
				if _, ok := n.reserved[r.FP]; ok {
					n.acked[r.FP] = max(n.acked[r.FP], r.Limit)
				}
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
		} else {
			n.activeOwn(&m)
		}
	case TypeReserve, TypeWindows:
		if n.role != RoleStandby {
			n.stats.SplitBrain++
			warn := n.warnLocked(&n.splitWarned)
			n.mu.Unlock()
			if warn {
				n.log.Warn("pair link: the other node acts as active too (split brain): each keeps to its own blocks, above the other's reports; VRRP decides which one carries the traffic")
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

// warnLocked reports whether a warning last given at *at may be given
// again (one each 10 s), and if so records now.
func (n *Node) warnLocked(at *time.Duration) bool {
	now := n.now()
	if *at != 0 && now-*at < 10*time.Second {
		return false
	}
	*at = max(now, 1)
	return true
}

// refuse counts a datagram Decode refused: one authentic under this
// node's own key is its own message sent back (its epoch is this
// node's), or the other node's numbered as this one (loudly: the two
// would share sequence blocks).
func (n *Node) refuse(b []byte, err error) {
	own := errors.Is(err, ErrAuth) && check(b, &n.sendKey) == nil
	n.mu.Lock()
	switch {
	case !own:
		n.stats.Rejected++
		n.mu.Unlock()
		n.log.Debug("pair link: message refused", "err", err)
	case epochOf(b) == n.epoch:
		n.stats.Reflected++
		n.mu.Unlock()
	default:
		n.stats.Misconfigured++
		n.misHeard = max(n.now(), 1)
		warn := n.warnLocked(&n.misWarned)
		n.mu.Unlock()
		if warn {
			n.log.Error("pair link: refusing the other node: it uses this node's number: give the nodes different --pair-node", "node", n.cfg.Node)
		}
	}
}

// record records a report of the other node in the ledger (the
// reservations the store takes; the others are counted and logged) and
// notes its keys as live; it returns the keys the store refused.
func (n *Node) record(m *Message) map[crypto.Fingerprint]bool {
	err := n.ledger.Apply(m)
	var refused map[crypto.Fingerprint]bool
	var re *RecordError
	if errors.As(err, &re) {
		refused = make(map[crypto.Fingerprint]bool, len(re.FPs))
		for _, fp := range re.FPs {
			refused[fp] = true
		}
	}
	now := n.now()
	n.mu.Lock()
	n.stats.RecordErrors += uint64(len(refused))
	for _, r := range m.Reservations {
		n.seen[r.FP] = now
	}
	for _, w := range m.Windows {
		n.seen[w.FP] = now
	}
	n.mu.Unlock()
	if err != nil {
		n.log.Error("pair link: cannot record the other node's report: those keys' reservations are not acknowledged, so the active uses them only on the lease", "refused", len(refused), "err", err)
	}
	return refused
}

// freshLocked reports whether m, an active's report, makes what it
// carries fresh (doc.go): it echoes a stamp of this node's run taken
// since it last became standby, and this node still stands by since.
func (n *Node) freshLocked(m *Message, standbySince uint64) bool {
	return n.role == RoleStandby && m.PeerEpoch == n.epoch && m.Echo >= standbySince && standbySince == n.standbySince
}

// standbyApply records an active's report, makes its keys fresh and
// acknowledges a Reserve's recorded reservations.
func (n *Node) standbyApply(m *Message, standbySince uint64) {
	refused := n.record(m)
	n.mu.Lock()
	fresh := n.freshLocked(m, standbySince)
	if m.Type == TypeWindows {
		if fresh {
			for _, w := range m.Windows {
				n.winFresh[w.FP] = max(n.winFresh[w.FP], m.Echo)
			}
		}
		n.mu.Unlock()
		if n.cfg.OnWindows != nil {
			n.cfg.OnWindows(m.Windows)
		}
		return
	}
	acked := make([]Reservation, 0, len(m.Reservations))
	for _, r := range m.Reservations {
		if refused[r.FP] {
			delete(n.fresh, r.FP) // not recorded: not fresh at all
			continue
		}
		if fresh {
			n.fresh[r.FP] = max(n.fresh[r.FP], m.Echo)
		}
		acked = append(acked, r)
	}
	if m.Type != TypeReserve {
		n.mu.Unlock()
		return
	}
	b := n.encodeLocked(&Message{Type: TypeAck, AckEpoch: m.Epoch, AckCounter: m.Counter, Reservations: acked})
	n.mu.Unlock()
	n.send(b)
}

// activeOwn records a standby's own reservations on an active node and
// holds them fresh when they echo a stamp of this node's run (doc.go), so
// that a state left silent at a takeover is released above them.
func (n *Node) activeOwn(m *Message) {
	refused := n.record(m)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.role != RoleActive || m.PeerEpoch != n.epoch {
		return
	}
	for _, r := range m.Reservations {
		if !refused[r.FP] {
			n.fresh[r.FP] = max(n.fresh[r.FP], m.Echo)
		}
	}
}

// followPeer records an active peer's reservations and hands them to
// OnPeerActive.
func (n *Node) followPeer(m *Message) {
	if m.Type != TypeReserve || len(m.Reservations) == 0 {
		return
	}
	n.record(m)
	// Even a reservation the store refused is followed: the state
	// continues above it in this node's own blocks, reserved anew.
	if n.cfg.OnPeerActive != nil {
		n.cfg.OnPeerActive(m.Reservations)
	}
}
