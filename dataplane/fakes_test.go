package dataplane

import (
	"errors"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"

	"github.com/espd/espd/packet"
)

// fakeTUN is an in-memory TUN: tests push batches of packets into in and
// read what the device writes from the callback or the recorded list.
type fakeTUN struct {
	batch, mtu int
	in         chan [][]byte
	closed     chan struct{}
	closeOnce  sync.Once

	mu      sync.Mutex
	record  bool
	written [][]byte
	count   atomic.Uint64
	notify  chan int // if set, receives the packet count of each Write
}

func newFakeTUN(batch, mtu int) *fakeTUN {
	return &fakeTUN{batch: batch, mtu: mtu, in: make(chan [][]byte, 64), closed: make(chan struct{}), record: true}
}

func (t *fakeTUN) BatchSize() int { return t.batch }
func (t *fakeTUN) MTU() int       { return t.mtu }

func (t *fakeTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	select {
	case pkts := <-t.in:
		n := 0
		for i, p := range pkts {
			if i == len(bufs) {
				break
			}
			sizes[i] = copy(bufs[i][offset:], p)
			n++
		}
		return n, nil
	case <-t.closed:
		return 0, os.ErrClosed
	}
}

func (t *fakeTUN) Write(bufs [][]byte, offset int) error {
	select {
	case <-t.closed:
		return os.ErrClosed
	default:
	}
	if t.record {
		t.mu.Lock()
		for _, b := range bufs {
			t.written = append(t.written, append([]byte(nil), b[offset:]...))
		}
		t.mu.Unlock()
	}
	t.count.Add(uint64(len(bufs)))
	if t.notify != nil {
		t.notify <- len(bufs)
	}
	return nil
}

func (t *fakeTUN) Close() error {
	t.closeOnce.Do(func() { close(t.closed) })
	return nil
}

// packets returns a copy of what was written so far.
func (t *fakeTUN) packets() [][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([][]byte(nil), t.written...)
}

// wire carries outer packets from a fakeSender to a fakeReceiver through a
// fixed set of slots, without allocating.
type wire struct {
	slots [][]byte
	free  chan int
	full  chan int
	cut   chan struct{} // closed with the receiver: senders stop waiting
}

func newWire(n int) *wire {
	w := &wire{slots: make([][]byte, n), free: make(chan int, n), full: make(chan int, n), cut: make(chan struct{})}
	for i := range w.slots {
		w.slots[i] = make([]byte, 0, BufferSize)
		w.free <- i
	}
	return w
}

// fakeSender records outer packets, forwards them to a wire, or both.
type fakeSender struct {
	mu      sync.Mutex
	record  bool
	sent    [][]byte
	wire    *wire
	gate    chan struct{} // if set, Send waits for a value first
	count   atomic.Uint64
	notify  chan int
	closed  atomic.Bool
	failAll bool
}

var errFakeClosed = errors.New("fake sender closed")

func (s *fakeSender) Send(pkts [][]byte) (int, error) {
	if s.gate != nil {
		<-s.gate
	}
	if s.closed.Load() || s.failAll {
		return 0, errFakeClosed
	}
	if s.record {
		s.mu.Lock()
		for _, p := range pkts {
			s.sent = append(s.sent, append([]byte(nil), p...))
		}
		s.mu.Unlock()
	}
	if s.wire != nil {
		for k, p := range pkts {
			var i int
			select {
			case i = <-s.wire.free:
			case <-s.wire.cut: // a full wire that nobody drains any more
				return k, errFakeClosed
			}
			s.wire.slots[i] = append(s.wire.slots[i][:0], p...)
			s.wire.full <- i
		}
	}
	s.count.Add(uint64(len(pkts)))
	if s.notify != nil {
		s.notify <- len(pkts)
	}
	return len(pkts), nil
}

func (s *fakeSender) Close() error { s.closed.Store(true); return nil }

func (s *fakeSender) packets() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.sent...)
}

// fakeReceiver delivers the outer packets of a wire as the kernel's
// sockets would: the ESP packet or UDP payload with the outer addresses
// and TOS.
type fakeReceiver struct {
	wire      *wire
	closed    chan struct{}
	closeOnce sync.Once
}

func newFakeReceiver(w *wire) *fakeReceiver {
	return &fakeReceiver{wire: w, closed: make(chan struct{})}
}

func (r *fakeReceiver) Receive(msgs []Message) (int, error) {
	var i int
	select {
	case i = <-r.wire.full:
	case <-r.closed:
		return 0, os.ErrClosed
	}
	n := 0
	for {
		deliver(&msgs[n], r.wire.slots[i])
		r.wire.free <- i
		n++
		if n == len(msgs) {
			return n, nil
		}
		select {
		case i = <-r.wire.full:
		default:
			return n, nil
		}
	}
}

func (r *fakeReceiver) Close() error {
	r.closeOnce.Do(func() {
		close(r.closed)
		close(r.wire.cut)
	})
	return nil
}

// inject puts one outer packet on the wire.
func (w *wire) inject(p []byte) {
	i := <-w.free
	w.slots[i] = append(w.slots[i][:0], p...)
	w.full <- i
}

// deliver fills m from the complete outer packet p.
func deliver(m *Message, p []byte) {
	buf := m.Buf
	*m = Message{Buf: buf}
	copy(buf[RecvOffset:], p)
	p = buf[RecvOffset : RecvOffset+len(p)]
	var proto uint8
	var hl int
	var src, dst netip.Addr
	switch p[0] >> 4 {
	case 4:
		h, err := packet.ParseIPv4Header(p)
		if err != nil {
			m.Err = ErrOuterHeader
			return
		}
		proto, hl, src, dst, m.TOS = h.Protocol, h.HeaderLen, h.Src, h.Dst, h.TOS
		p = p[:h.TotalLen]
	case 6:
		h, err := packet.ParseIPv6Header(p)
		if err != nil {
			m.Err = ErrOuterHeader
			return
		}
		proto, hl, src, dst, m.TOS = h.NextHeader, packet.IPv6HeaderLen, h.Src, h.Dst, h.TrafficClass
		p = p[:packet.IPv6HeaderLen+int(h.PayloadLen)]
	default:
		m.Err = ErrOuterHeader
		return
	}
	m.Start, m.End = RecvOffset+hl, RecvOffset+len(p)
	m.Src, m.Dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
	if proto == packet.ProtoUDP {
		u, _, err := packet.ParseUDPHeader(p[hl:])
		if err != nil {
			m.Err = ErrOuterHeader
			return
		}
		m.UDP = true
		m.Start += packet.UDPHeaderLen
		m.End = m.Start + int(u.Length) - packet.UDPHeaderLen
		m.Src, m.Dst = netip.AddrPortFrom(src, u.SrcPort), netip.AddrPortFrom(dst, u.DstPort)
	} else if proto != packet.ProtoESP {
		m.Err = ErrNotESP
	}
}
