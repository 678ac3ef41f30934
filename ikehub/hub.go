// Package ikehub is espd's IKE hand-off hub (espd --ike-handoff): it takes
// the IKE datagrams that arrive on espd's IKE ports (conn.IKE) to the one
// IKE daemon registered on the control socket (charon's espd plugin), and
// sends that daemon's datagrams back out through the same ports. A newer
// registration replaces an older one.
//
// What packets can cause is counted, never logged per datagram: a
// datagram the hub cannot deliver (too long for an IKE_PACKET message, no
// IKE daemon registered, its queue full) counts in Stats' undelivered
// and is logged at most once every 10 s.
package ikehub

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
)

// Hub connects the IKE ports to the current registration.
type Hub struct {
	ike conn.IKE
	log *slog.Logger

	mu  sync.Mutex
	cur *session
	// pending keeps, between two registrations (charon restarting), what
	// arrived or what the ended one never read, for the next one: at most
	// pendingMax datagrams, none older than pendingAge. Before the first
	// registration nothing is kept.
	pending    []pendingIKE
	registered bool    // a registration has existed
	absent     absence // the time without a registration (absent.go)

	// undelivered counts the datagrams dropped because they were too
	// long for an IKE_PACKET message, no IKE daemon was registered or its
	// queue was full.
	undelivered atomic.Uint64
	// dropLog limits the log of those drops, which peers can cause, to a
	// line every 10 s.
	dropLog conn.LogLimit
}

var _ control.IKEBackend = (*Hub)(nil)

// What the hub keeps between two registrations. A restarting charon
// registers again within a second; a peer's request that arrives in
// between (typically its IKE_SA_INIT right after the old charon's
// delete) would otherwise wait for the peer's retransmit, 4 s or more.
// charon's espd plugin holds such a request until its connections are
// loaded.
const (
	pendingMax = 32
	pendingAge = 5 * time.Second
)

type pendingIKE struct {
	p    conn.IKEPacket
	when time.Time
}

// Start takes over ike's IKE port (0: conn.DefaultIKEPort) and returns
// the hub that hands its datagrams over; log (nil: none) hears of the
// hand-off and its drops.
func Start(ike conn.IKE, port uint16, log *slog.Logger) (*Hub, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Hub{ike: ike, log: log, dropLog: conn.LogLimit{Every: 10 * time.Second}}
	if err := ike.StartIKE(port, h.deliver); err != nil {
		return nil, err
	}
	ikePort, natt := ike.IKEPorts()
	h.log.Info("IKE hand-off started", "ike_port", ikePort, "natt_port", natt)
	return h, nil
}

// Stop ends the registration and closes the IKE port.
func (h *Hub) Stop() error {
	h.stopAbsent()
	h.mu.Lock()
	cur := h.cur
	h.mu.Unlock()
	if cur != nil {
		cur.Close()
	}
	return h.ike.StopIKE()
}

// Stats returns the relay's counters (which the sockets keep after Stop)
// and the datagrams the hub could not deliver.
func (h *Hub) Stats() (relay conn.IKEStats, undelivered uint64) {
	return h.ike.IKEStats(), h.undelivered.Load()
}

// keep adds p to pending, dropping the oldest beyond pendingMax. h.mu is
// held.
func (h *Hub) keep(p conn.IKEPacket, when time.Time) {
	if len(h.pending) == pendingMax {
		h.drop(h.pending[0].p, "more arrived while no IKE daemon was registered than are kept")
		h.pending = append(h.pending[:0], h.pending[1:]...)
	}
	h.pending = append(h.pending, pendingIKE{p, when})
}

// RegisterIKE implements control.IKEBackend: the caller receives the IKE
// datagrams from now on, up to queue (0: 1024) of them queued; an earlier
// registration ends.
func (h *Hub) RegisterIKE(queue int) (control.IKESession, error) {
	if queue <= 0 {
		queue = 1024
	}
	s := &session{hub: h, ch: make(chan conn.IKEPacket, queue)}
	h.mu.Lock()
	old := h.cur
	h.cur = s
	h.registered = true
	h.back()
	pending := h.pending
	h.pending = nil
	// Under h.mu, so that nothing deliver queues overtakes them.
	for _, q := range pending {
		if time.Since(q.when) > pendingAge || !s.offer(q.p) {
			h.drop(q.p, "kept too long for the next IKE daemon")
		}
	}
	h.mu.Unlock()
	if old != nil {
		h.log.Warn("IKE hand-off taken over by a new registration; the previous one ends")
		old.Close()
	}
	ike, natt := h.ike.IKEPorts()
	h.log.Info("IKE daemon registered for the hand-off", "ike_port", ike, "natt_port", natt)
	return s, nil
}

// deliver is the IKE ports' handler: it copies the datagram to the
// registration's queue, or drops and counts it.
func (h *Hub) deliver(p conn.IKEPacket) {
	if len(p.Data) > maxIKEData(p.Src.Addr(), p.Dst.Addr()) {
		h.drop(p, "longer than an IKE_PACKET message carries (docs/control-protocol.md, section 9)")
		return
	}
	c := conn.IKEPacket{Src: p.Src, Dst: p.Dst, Data: append([]byte(nil), p.Data...)}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch s := h.cur; {
	case s == nil && !h.registered:
		h.drop(p, "no IKE daemon registered")
	case s == nil:
		h.keep(c, time.Now())
	case !s.offer(c):
		h.drop(p, "the IKE daemon's queue is full")
	}
}

// drop counts an undelivered datagram and logs it, rate-limited.
func (h *Hub) drop(p conn.IKEPacket, why string) {
	n := h.undelivered.Add(1)
	h.dropLog.Warn(h.log, "IKE datagram dropped", "from", p.Src, "bytes", len(p.Data), "reason", why, "dropped_total", n)
}

// maxIKEData is the longest IKE datagram from src to dst that the
// hand-off takes: what an IKE_PACKET message (SRC if valid, DST,
// IKE_PORTS, IKE_DATA) carries within wire.MaxMessageSize, 65,492
// bytes over IPv4 and 65,468 over IPv6. Every part is a multiple of 4
// bytes, so IKE_DATA's padding costs nothing at the limit.
func maxIKEData(src, dst netip.Addr) int {
	n := wire.MaxMessageSize - wire.HeaderLen - (wire.AttrHeaderLen + 4) - wire.AttrHeaderLen
	for _, a := range [2]netip.Addr{src, dst} {
		if a.IsValid() {
			n -= wire.AttrHeaderLen + a.Unmap().BitLen()/8
		}
	}
	return min(n, 0xFFFF-wire.AttrHeaderLen)
}

// session is one registration.
type session struct {
	hub *Hub
	ch  chan conn.IKEPacket

	mu     sync.Mutex
	closed bool
}

// offer queues p without blocking; false if the queue is full or the
// session ended.
func (s *session) offer(p conn.IKEPacket) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	select {
	case s.ch <- p:
		return true
	default:
		return false
	}
}

// Packets implements control.IKESession.
func (s *session) Packets() <-chan conn.IKEPacket { return s.ch }

// Ports implements control.IKESession.
func (s *session) Ports() (ike, natt uint16) { return s.hub.ike.IKEPorts() }

// Send implements control.IKESession.
func (s *session) Send(p conn.IKEPacket) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return wire.Errorf(wire.ENOENT, "the IKE hand-off registration ended")
	}
	err := s.hub.ike.SendIKE(p)
	if err != nil && errors.Is(err, conn.ErrIKEOff) {
		return wire.Errorf(wire.EOPNOTSUPP, "IKE hand-off stopped")
	}
	if err != nil {
		return fmt.Errorf("sending IKE to %v: %w", p.Dst, err)
	}
	return nil
}

// Close implements control.IKESession.
func (s *session) Close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.ch)
	}
	s.mu.Unlock()
	h := s.hub
	h.mu.Lock()
	// What the ended registration never read goes to the next one.
	switch now := time.Now(); {
	case h.cur == s:
		h.cur = nil
		h.ended(now)
		for p := range s.ch {
			h.keep(p, now)
		}
	case h.cur != nil:
		for p := range s.ch {
			if !h.cur.offer(p) {
				h.drop(p, "the IKE daemon's queue is full")
			}
		}
	}
	h.mu.Unlock()
}
