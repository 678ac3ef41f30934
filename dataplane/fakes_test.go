package dataplane

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/net/ipv6"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/tun"
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

func (t *fakeTUN) Stats() tun.Stats { return tun.Stats{} }
func (t *fakeTUN) MTU() int         { return t.mtu }

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

// fakeSender is the fake conn.Bind: it turns each Packet into the IP
// packets the kernel's raw path would put on the wire (the outer header,
// and fragments where the Packet asks for them), records them, forwards
// them to a wire, or both; its receivers are given by the harness, and
// its IKE hand-off hands datagrams to the handler in memory.
type fakeSender struct {
	mu      sync.Mutex
	record  bool
	sent    [][]byte
	wire    *wire
	gate    chan struct{} // if set, Send waits for a value first
	count   atomic.Uint64
	notify  chan int
	closed  atomic.Bool
	failAll atomic.Bool

	recv []conn.Receiver
	ips  [][]byte // Send's scratch, under mu

	ikeMu      sync.Mutex
	ikeHandler conn.IKEHandler
	ikePort    uint16
	ikeSent    []conn.IKEPacket
	ikeStats   conn.IKEStats
}

var _ conn.Bind = (*fakeSender)(nil)

var errFakeClosed = errors.New("fake sender closed")

// wireForm appends to ips the IP packets the kernel's raw path sends for
// p: the packet with its outer header written in place, or (allocated)
// its fragments.
func wireForm(ips [][]byte, p *conn.Packet) ([][]byte, error) {
	full, err := conn.PutOuter(p)
	if err != nil {
		return ips, err
	}
	if p.FragmentAbove <= 0 || len(full) <= p.FragmentAbove {
		return append(ips, full), nil
	}
	frags := make([][]byte, len(full)/8+2)
	for i := range frags {
		frags[i] = make([]byte, p.FragmentAbove)
	}
	var n int
	if p.Dst.Is6() {
		n, err = packet.FragmentIPv6(frags, full, p.FragmentAbove, 7)
	} else {
		n, err = packet.FragmentIPv4(frags, full, p.FragmentAbove)
	}
	return append(ips, frags[:n]...), err
}

// Send turns pkts into IP packets and records or forwards copies of them;
// without fragments and recording it allocates nothing.
func (s *fakeSender) Send(pkts []conn.Packet) (int, error) {
	if s.gate != nil {
		<-s.gate
	}
	if s.closed.Load() || s.failAll.Load() {
		return 0, errFakeClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ips := s.ips[:0]
	var err error
	for i := range pkts {
		if ips, err = wireForm(ips, &pkts[i]); err != nil {
			break
		}
	}
	s.ips = ips
	if s.record {
		for _, p := range ips {
			s.sent = append(s.sent, append([]byte(nil), p...))
		}
	}
	if s.wire != nil {
		for k, p := range ips {
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
	clear(s.ips)
	s.count.Add(uint64(len(ips)))
	if s.notify != nil {
		s.notify <- len(ips)
	}
	return len(ips), err
}

func (s *fakeSender) Receivers() []conn.Receiver { return s.recv }

func (s *fakeSender) Stats() conn.Stats { return conn.Stats{} }

func (s *fakeSender) StartIKE(port uint16, h conn.IKEHandler) error {
	s.ikeMu.Lock()
	defer s.ikeMu.Unlock()
	if s.ikeHandler != nil {
		return conn.ErrIKERunning
	}
	s.ikeHandler, s.ikePort = h, port
	return nil
}

func (s *fakeSender) StopIKE() error {
	s.ikeMu.Lock()
	defer s.ikeMu.Unlock()
	if s.ikeHandler == nil {
		return conn.ErrIKEOff
	}
	s.ikeHandler = nil
	return nil
}

func (s *fakeSender) DeliverIKE(p conn.IKEPacket) {
	s.ikeMu.Lock()
	h := s.ikeHandler
	if h != nil {
		s.ikeStats.Received++
	}
	s.ikeMu.Unlock()
	if h != nil {
		h(p)
	}
}

func (s *fakeSender) SendIKE(p conn.IKEPacket) error {
	s.ikeMu.Lock()
	defer s.ikeMu.Unlock()
	if s.ikeHandler == nil {
		return conn.ErrIKEOff
	}
	s.ikeSent = append(s.ikeSent, conn.IKEPacket{Src: p.Src, Dst: p.Dst, Data: append([]byte(nil), p.Data...)})
	s.ikeStats.Sent++
	return nil
}

func (s *fakeSender) IKEPorts() (ike, natt uint16) {
	s.ikeMu.Lock()
	defer s.ikeMu.Unlock()
	return s.ikePort, conn.DefaultEncapPort
}

func (s *fakeSender) IKEStats() conn.IKEStats {
	s.ikeMu.Lock()
	defer s.ikeMu.Unlock()
	return s.ikeStats
}

func (s *fakeSender) Close() error {
	s.closed.Store(true)
	for _, r := range s.recv {
		r.Close()
	}
	return nil
}

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

func (r *fakeReceiver) Receive(msgs []conn.Message) (int, error) {
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
func deliver(m *conn.Message, p []byte) {
	buf := m.Buf
	*m = conn.Message{Buf: buf}
	copy(buf[conn.RecvOffset:], p)
	p = buf[conn.RecvOffset : conn.RecvOffset+len(p)]
	var proto uint8
	var hl int
	var src, dst netip.Addr
	switch p[0] >> 4 {
	case 4:
		h, err := packet.ParseIPv4Header(p)
		if err != nil {
			m.Err = conn.ErrOuterHeader
			return
		}
		proto, hl, src, dst, m.TOS = h.Protocol, h.HeaderLen, h.Src, h.Dst, h.TOS
		p = p[:h.TotalLen]
	case 6:
		h, err := ipv6.ParseHeader(p)
		if err != nil || packet.IPv6HeaderLen+h.PayloadLen > len(p) {
			m.Err = conn.ErrOuterHeader
			return
		}
		src, _ = netip.AddrFromSlice(h.Src)
		dst, _ = netip.AddrFromSlice(h.Dst)
		proto, hl, m.TOS = uint8(h.NextHeader), packet.IPv6HeaderLen, uint8(h.TrafficClass)
		p = p[:packet.IPv6HeaderLen+h.PayloadLen]
	default:
		m.Err = conn.ErrOuterHeader
		return
	}
	m.Start, m.End = conn.RecvOffset+hl, conn.RecvOffset+len(p)
	m.Src, m.Dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
	if proto == packet.ProtoUDP {
		u := p[hl:]
		var l int
		if len(u) >= packet.UDPHeaderLen {
			l = int(binary.BigEndian.Uint16(u[4:6]))
		}
		if l < packet.UDPHeaderLen || l > len(u) {
			m.Err = conn.ErrOuterHeader
			return
		}
		m.UDP = true
		m.Start += packet.UDPHeaderLen
		m.End = m.Start + l - packet.UDPHeaderLen
		m.Src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(u[0:2]))
		m.Dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(u[2:4]))
	} else if proto != packet.ProtoESP {
		m.Err = conn.ErrNotESP
	}
}
