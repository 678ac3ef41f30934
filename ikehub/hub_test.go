package ikehub

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
)

// fakeIKE is a conn.IKE without sockets: the test calls the handler
// StartIKE was given, and SendIKE records what it sends.
type fakeIKE struct {
	mu      sync.Mutex
	h       conn.IKEHandler
	port    uint16
	stopped bool
	sent    []conn.IKEPacket
	sendErr error
	st      conn.IKEStats
}

func (f *fakeIKE) StartIKE(port uint16, h conn.IKEHandler) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.h != nil {
		return conn.ErrIKERunning
	}
	f.h, f.port = h, port
	return nil
}

func (f *fakeIKE) StopIKE() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = true
	return nil
}

func (f *fakeIKE) DeliverIKE(p conn.IKEPacket) { f.h(p) }

func (f *fakeIKE) SendIKE(p conn.IKEPacket) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sendErr != nil {
		return f.sendErr
	}
	f.sent = append(f.sent, p)
	return nil
}

func (f *fakeIKE) IKEPorts() (ike, natt uint16) { return 500, 4500 }

func (f *fakeIKE) IKEStats() conn.IKEStats { return f.st }

var (
	peer   = netip.MustParseAddrPort("198.18.0.2:500")
	local  = netip.MustParseAddrPort("198.18.0.1:500")
	peer6  = netip.MustParseAddrPort("[2001:db8::2]:500")
	local6 = netip.MustParseAddrPort("[2001:db8::1]:500")
)

// start runs a hub over a fakeIKE.
func start(t *testing.T) (*Hub, *fakeIKE) {
	t.Helper()
	f := &fakeIKE{}
	h, err := Start(f, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop() })
	return h, f
}

// arrive hands the hub a datagram from the peer, as the sockets do.
func (f *fakeIKE) arrive(data string) {
	f.DeliverIKE(conn.IKEPacket{Src: peer, Dst: local, Data: []byte(data)})
}

func undelivered(h *Hub) uint64 { _, n := h.Stats(); return n }

// expect reads want from s's queue, in order, and fails on anything else
// queued after them.
func expect(t *testing.T, s control.IKESession, want ...string) {
	t.Helper()
	for _, w := range want {
		select {
		case p := <-s.Packets():
			if string(p.Data) != w {
				t.Errorf("the registration got %q, want %q", p.Data, w)
			}
		default:
			t.Fatalf("%q did not reach the registration", w)
		}
	}
	select {
	case p, ok := <-s.Packets():
		if ok {
			t.Errorf("the registration got %q, more than %q", p.Data, want)
		}
	default:
	}
}

// TestMaxIKEData: the longest datagram the hand-off takes is what an
// IKE_PACKET message carries: 65,492 bytes over IPv4, 65,468 over IPv6
// (docs/control-protocol.md, section 9).
func TestMaxIKEData(t *testing.T) {
	for _, c := range []struct {
		src, dst netip.Addr
		want     int
	}{
		{peer.Addr(), local.Addr(), 65492},
		{peer6.Addr(), local6.Addr(), 65468},
	} {
		if got := maxIKEData(c.src, c.dst); got != c.want {
			t.Errorf("maxIKEData(%v, %v) = %d, want %d", c.src, c.dst, got, c.want)
		}
	}
}

// TestOverlongDropped: a datagram one byte longer than maxIKEData is
// dropped and counted, the longest that fits reaches the registration
// whole, over both families.
func TestOverlongDropped(t *testing.T) {
	h, f := start(t)
	s, err := h.RegisterIKE(8)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range [][2]netip.AddrPort{{peer, local}, {peer6, local6}} {
		n := maxIKEData(a[0].Addr(), a[1].Addr())
		fits := bytes.Repeat([]byte{0xa5}, n)
		f.DeliverIKE(conn.IKEPacket{Src: a[0], Dst: a[1], Data: fits})
		f.DeliverIKE(conn.IKEPacket{Src: a[0], Dst: a[1], Data: make([]byte, n+1)})
		select {
		case p := <-s.Packets():
			if !bytes.Equal(p.Data, fits) || p.Src != a[0] || p.Dst != a[1] {
				t.Errorf("handed over %d bytes %v -> %v, want %d bytes %v -> %v", len(p.Data), p.Src, p.Dst, n, a[0], a[1])
			}
		default:
			t.Fatalf("the longest datagram that fits (%d bytes to %v) was not handed over", n, a[1])
		}
		if got := undelivered(h); got != uint64(i+1) {
			t.Errorf("undelivered %d after %d over-long datagrams", got, i+1)
		}
	}
	expect(t, s)
}

// TestKeptBetweenRegistrations: a datagram that arrives while charon
// restarts (one registration ended, the next not yet there), or that the
// ended registration never read, reaches the next registration instead
// of waiting for the peer's retransmit; one that arrives before any
// registration is dropped and counted, and so is one kept longer than
// pendingAge.
func TestKeptBetweenRegistrations(t *testing.T) {
	h, f := start(t)
	pending := func() int {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.pending)
	}

	f.arrive("before any registration")
	if n := undelivered(h); n != 1 {
		t.Fatalf("undelivered %d after a datagram before any registration, want 1", n)
	}

	s1, err := h.RegisterIKE(8)
	if err != nil {
		t.Fatal(err)
	}
	f.arrive("unread by the first")
	if n := len(s1.Packets()); n != 1 {
		t.Fatalf("%d datagrams queued, want 1", n)
	}
	s1.Close()
	f.arrive("while charon restarts")
	if n := pending(); n != 2 {
		t.Fatalf("%d datagrams kept, want 2", n)
	}
	s2, err := h.RegisterIKE(8)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, s2, "unread by the first", "while charon restarts")
	s2.Close()

	f.arrive("stale")
	if n := pending(); n != 1 {
		t.Fatalf("%d datagrams kept, want 1", n)
	}
	h.mu.Lock()
	h.pending[0].when = h.pending[0].when.Add(-2 * pendingAge)
	h.mu.Unlock()
	s3, err := h.RegisterIKE(8)
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if n := undelivered(h); n != 2 {
		t.Errorf("undelivered %d, want 2 (before any registration, stale)", n)
	}
	expect(t, s3)
}

// TestPendingBounded: between two registrations at most pendingMax
// datagrams are kept, the newest; the older ones are dropped and counted.
func TestPendingBounded(t *testing.T) {
	h, f := start(t)
	s1, err := h.RegisterIKE(8)
	if err != nil {
		t.Fatal(err)
	}
	s1.Close()
	var want []string
	for i := range pendingMax + 3 {
		d := strings.Repeat("x", i+1)
		f.arrive(d)
		want = append(want, d)
	}
	if n := undelivered(h); n != 3 {
		t.Errorf("undelivered %d, want 3", n)
	}
	s2, err := h.RegisterIKE(2 * pendingMax)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	expect(t, s2, want[3:]...)
}

// TestQueueFullAndTakeover: a datagram beyond the registration's queue is
// dropped and counted; a newer registration closes the older one's queue
// and receives the older one's unread datagrams.
func TestQueueFullAndTakeover(t *testing.T) {
	h, f := start(t)
	s1, err := h.RegisterIKE(1)
	if err != nil {
		t.Fatal(err)
	}
	f.arrive("one")
	f.arrive("two")
	if n := undelivered(h); n != 1 {
		t.Errorf("undelivered %d with a queue of one and two datagrams, want 1", n)
	}
	s2, err := h.RegisterIKE(8)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, ok := <-s1.Packets(); ok {
		t.Error("the older registration's queue still delivers after a takeover")
	}
	expect(t, s2, "one")
	if err := s1.Send(conn.IKEPacket{Src: local, Dst: peer, Data: []byte("late")}); !isCode(err, wire.ENOENT) {
		t.Errorf("Send on an ended registration: %v, want ENOENT", err)
	}
}

// TestSend: a registration's datagrams go out through the IKE ports; a
// stopped hand-off answers EOPNOTSUPP, another failure is the error; Stop
// ends the registration and closes the port.
func TestSend(t *testing.T) {
	h, f := start(t)
	s, err := h.RegisterIKE(0)
	if err != nil {
		t.Fatal(err)
	}
	if ike, natt := s.Ports(); ike != 500 || natt != 4500 {
		t.Errorf("Ports() = %d, %d", ike, natt)
	}
	p := conn.IKEPacket{Src: local, Dst: peer, Data: []byte("out")}
	if err := s.Send(p); err != nil {
		t.Fatal(err)
	}
	if len(f.sent) != 1 || string(f.sent[0].Data) != "out" || f.sent[0].Dst != peer {
		t.Errorf("sent %+v", f.sent)
	}
	f.sendErr = conn.ErrIKEOff
	if err := s.Send(p); !isCode(err, wire.EOPNOTSUPP) {
		t.Errorf("Send with the hand-off stopped: %v, want EOPNOTSUPP", err)
	}
	refused := errors.New("no route")
	f.sendErr = refused
	if err := s.Send(p); !errors.Is(err, refused) {
		t.Errorf("Send refused by the sockets: %v", err)
	}
	if err := h.Stop(); err != nil || !f.stopped {
		t.Fatalf("Stop: %v, port stopped %v", err, f.stopped)
	}
	if _, ok := <-s.Packets(); ok {
		t.Error("the registration's queue still delivers after Stop")
	}
}

// isCode reports whether err is a control protocol error with code.
func isCode(err error, code wire.Errno) bool {
	var e *wire.Error
	return errors.As(err, &e) && e.Code == code
}
