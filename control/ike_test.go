package control

import (
	"bytes"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	sockets "github.com/espd/espd/conn"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// ikeBackend is a Backend with a fake IKE hand-off.
type ikeBackend struct {
	dbBackend
	mu       sync.Mutex
	sessions []*fakeIKESession
	sent     chan sockets.IKEPacket
}

func (b *ikeBackend) RegisterIKE(queue int) (IKESession, error) {
	s := &fakeIKESession{ch: make(chan sockets.IKEPacket, queue), sent: b.sent}
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.sessions); n > 0 {
		b.sessions[n-1].Close()
	}
	b.sessions = append(b.sessions, s)
	return s, nil
}

// current returns the newest session.
func (b *ikeBackend) current() *fakeIKESession {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.sessions) == 0 {
		return nil
	}
	return b.sessions[len(b.sessions)-1]
}

type fakeIKESession struct {
	mu     sync.Mutex
	ch     chan sockets.IKEPacket
	closed bool
	sent   chan sockets.IKEPacket
}

func (s *fakeIKESession) Packets() <-chan sockets.IKEPacket { return s.ch }
func (s *fakeIKESession) Ports() (uint16, uint16)           { return 500, 4500 }
func (s *fakeIKESession) Send(p sockets.IKEPacket) error {
	if p.Dst.Port() == 9 {
		return wire.Errorf(wire.EINVAL, "refused: discard port")
	}
	s.sent <- p
	return nil
}
func (s *fakeIKESession) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.ch)
	}
}
func (s *fakeIKESession) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}
func (s *fakeIKESession) deliver(t *testing.T, p sockets.IKEPacket) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		t.Fatal("deliver on a closed session")
	}
	s.ch <- p
}

func startIKEServer(t *testing.T) (*ikeBackend, string) {
	t.Helper()
	b := &ikeBackend{dbBackend: dbBackend{sa.NewDB(sa.Options{})}, sent: make(chan sockets.IKEPacket, 16)}
	path := filepath.Join(t.TempDir(), "espd.sock")
	serveT(t, b, ServerConfig{Path: path, Logf: t.Logf})
	return b, path
}

func register(t *testing.T, r *rawConn, seq uint32) {
	t.Helper()
	r.send(encode(t, wire.MsgIKERegister, 0, seq, nil))
	m, err := r.read()
	if err != nil {
		t.Fatal(err)
	}
	if m.Type != wire.MsgIKERegister || m.Flags != wire.FlagReply || m.Seq != seq {
		t.Fatalf("IKE_REGISTER reply: %v flags %d seq %d", m.Type, m.Flags, m.Seq)
	}
	ike, natt, err := wire.ReadIKEPorts(m.Attrs)
	if err != nil || ike != 500 || natt != 4500 {
		t.Fatalf("IKE_REGISTER reply ports %d %d (%v), want 500 4500", ike, natt, err)
	}
}

var (
	ikePeer  = netip.MustParseAddrPort("198.18.0.2:4500")
	ikeLocal = netip.MustParseAddrPort("198.18.0.1:4500")
)

func TestIKERegisterWithoutHandoff(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	r := rawDial(t, ts.path)
	r.send(encode(t, wire.MsgIKERegister, 0, 3, nil))
	e := r.wantError(3, wire.EOPNOTSUPP)
	if !bytes.Contains([]byte(e.Msg), []byte("--ike-handoff")) {
		t.Errorf("error %q does not say how to turn the hand-off on", e.Msg)
	}
	r.wantUsable(4)
}

func TestIKEHandoff(t *testing.T) {
	b, path := startIKEServer(t)
	r := rawDial(t, path)

	// Before registering, IKE_PACKET is refused.
	r.send(encode(t, wire.MsgIKEPacket, 0, 1, func(b *wire.Builder) {
		putIKE(b, sockets.IKEPacket{Src: ikeLocal, Dst: ikePeer, Data: []byte{0, 0, 0, 0, 1}})
	}))
	r.wantError(1, wire.EPROTO)

	register(t, r, 7)
	r.send(encode(t, wire.MsgIKERegister, 0, 8, nil))
	r.wantError(8, wire.EALREADY)

	// espd -> client: an IKE_PACKET with the registration's sequence
	// number and flags 0, payload as received.
	in := sockets.IKEPacket{Src: ikePeer, Dst: ikeLocal, Data: []byte{0, 0, 0, 0, 0x11, 0x22, 0x33}}
	b.current().deliver(t, in)
	m, err := r.read()
	if err != nil {
		t.Fatal(err)
	}
	if m.Type != wire.MsgIKEPacket || m.Flags != 0 || m.Seq != 7 {
		t.Fatalf("got %v flags %d seq %d, want IKE_PACKET flags 0 seq 7", m.Type, m.Flags, m.Seq)
	}
	got, err := readIKE(m.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	if got.Src != in.Src || got.Dst != in.Dst || !bytes.Equal(got.Data, in.Data) {
		t.Fatalf("received %+v, want %+v", got, in)
	}

	// client -> espd: sent without a reply; IPv6 and no SRC too.
	out := []sockets.IKEPacket{
		{Src: ikeLocal, Dst: ikePeer, Data: []byte{0, 0, 0, 0, 0xaa}},
		{Src: netip.AddrPortFrom(netip.Addr{}, 500), Dst: netip.MustParseAddrPort("[2001:db8::2]:500"), Data: []byte{0xbb}},
	}
	for i, p := range out {
		r.send(encode(t, wire.MsgIKEPacket, 0, uint32(20+i), func(b *wire.Builder) { putIKE(b, p) }))
	}
	for _, want := range out {
		select {
		case p := <-b.sent:
			if p.Src != want.Src || p.Dst != want.Dst || !bytes.Equal(p.Data, want.Data) {
				t.Fatalf("backend got %+v, want %+v", p, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("IKE_PACKET not handed to the backend")
		}
	}
	// No reply was sent for them: the next message answers the HELLO.
	r.wantUsable(30)

	// A packet the backend refuses, and malformed ones, get an ERROR with
	// their sequence number.
	r.send(encode(t, wire.MsgIKEPacket, 0, 31, func(b *wire.Builder) {
		putIKE(b, sockets.IKEPacket{Src: ikeLocal, Dst: netip.MustParseAddrPort("198.18.0.2:9"), Data: []byte{1}})
	}))
	r.wantError(31, wire.EINVAL)
	r.send(encode(t, wire.MsgIKEPacket, 0, 32, func(b *wire.Builder) { b.Raw(wire.AttrIKEData, []byte{1}) }))
	r.wantError(32, wire.EINVAL)
	r.send(encode(t, wire.MsgIKEPacket, 0, 33, func(b *wire.Builder) {
		b.Addr(wire.AttrSrc, ikeLocal.Addr())
		b.Addr(wire.AttrDst, netip.MustParseAddr("2001:db8::2"))
		b.U16Pair(wire.AttrIKEPorts, 500, 500)
		b.Raw(wire.AttrIKEData, []byte{1})
	}))
	r.wantError(33, wire.EINVAL)

	// IKE_UNREGISTER ends the session; a second one finds nothing.
	s := b.current()
	r.send(encode(t, wire.MsgIKEUnregister, 0, 40, nil))
	if m, err := r.read(); err != nil || m.Type != wire.MsgIKEUnregister || m.Flags != wire.FlagReply || m.Seq != 40 {
		t.Fatalf("IKE_UNREGISTER reply: %v %v", m, err)
	}
	if !s.isClosed() {
		t.Fatal("session not closed by IKE_UNREGISTER")
	}
	r.send(encode(t, wire.MsgIKEUnregister, 0, 41, nil))
	r.wantError(41, wire.ENOENT)
}

// TestIKEHandoffTakeover: a newer registration takes over; the older
// connection is told with an IKE_UNREGISTER; a closed connection ends its
// session.
func TestIKEHandoffTakeover(t *testing.T) {
	b, path := startIKEServer(t)
	r1 := rawDial(t, path)
	register(t, r1, 5)
	first := b.current()

	r2 := rawDial(t, path)
	register(t, r2, 6)
	if !first.isClosed() {
		t.Fatal("first session still open after the second registration")
	}
	m, err := r1.read()
	if err != nil {
		t.Fatal(err)
	}
	if m.Type != wire.MsgIKEUnregister || m.Flags != 0 || m.Seq != 5 {
		t.Fatalf("first client got %v flags %d seq %d, want IKE_UNREGISTER flags 0 seq 5", m.Type, m.Flags, m.Seq)
	}
	// The first connection may register again.
	r1.send(encode(t, wire.MsgIKEPacket, 0, 9, func(b *wire.Builder) {
		putIKE(b, sockets.IKEPacket{Src: ikeLocal, Dst: ikePeer, Data: []byte{0, 0, 0, 0}})
	}))
	r1.wantError(9, wire.EPROTO)

	second := b.current()
	r2.nc.Close()
	deadline := time.Now().Add(5 * time.Second)
	for !second.isClosed() {
		if time.Now().After(deadline) {
			t.Fatal("session of a closed connection still open")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// putIKE appends the attributes of an IKE_PACKET carrying p.
func putIKE(b *wire.Builder, p sockets.IKEPacket) { wire.PutIKEPacket(b, p.Src, p.Dst, p.Data) }

// readIKE reads an IKE_PACKET.
func readIKE(attrs []wire.Attr) (sockets.IKEPacket, error) {
	src, dst, data, err := wire.ReadIKEPacket(attrs)
	return sockets.IKEPacket{Src: src, Dst: dst, Data: data}, err
}
