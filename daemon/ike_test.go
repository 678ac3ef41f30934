package daemon

import (
	"bytes"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/testbed"
)

// handoffPeer is a namespace next to the daemon's, with UDP sockets on the
// IKE ports of 198.18.0.2 and 2001:db8::2.
type handoffPeer struct {
	ns               *testbed.Node
	ike4, natt4      *net.UDPConn
	ike6, natt6      *net.UDPConn
	daemon4, daemon6 netip.Addr
	peer4, peer6     netip.Addr
}

// startHandoff runs a daemon with the IKE hand-off in a namespace linked
// to a peer namespace over a veth pair (198.18.0.1 and .2), logging to
// log (nil: nowhere).
func startHandoff(t *testing.T, log *slog.Logger) (*Daemon, string, *handoffPeer) {
	t.Helper()
	ns := testbed.NewNodeT(t, "ike")
	peer := testbed.NewNodeT(t, "ikepeer")
	testbed.VethT(t, ns, "veth0", peer, "veth0")
	ns.MustIP(t, "addr", "add", "198.18.0.1/24", "dev", "veth0")
	ns.MustIP(t, "addr", "add", "2001:db8::1/64", "dev", "veth0", "nodad")
	ns.MustIP(t, "link", "set", "veth0", "up")
	peer.MustIP(t, "addr", "add", "198.18.0.2/24", "dev", "veth0")
	peer.MustIP(t, "addr", "add", "2001:db8::2/64", "dev", "veth0", "nodad")
	peer.MustIP(t, "link", "set", "veth0", "up")

	sock := filepath.Join(t.TempDir(), "espd.sock")
	d, err := New(Options{
		Dataplane:  dataplane.Config{Keepalive: -1},
		Control:    control.ServerConfig{Path: sock},
		IKEHandoff: true,
		Logger:     log,
	})
	if err != nil {
		t.Fatal(err)
	}
	run := runIn(t, ns, d, nil)
	hp := &handoffPeer{ns: peer,
		daemon4: netip.MustParseAddr("198.18.0.1"), daemon6: netip.MustParseAddr("2001:db8::1"),
		peer4: netip.MustParseAddr("198.18.0.2"), peer6: netip.MustParseAddr("2001:db8::2")}
	if err := peer.Do(func() error {
		for _, l := range []struct {
			c    **net.UDPConn
			addr netip.Addr
			port uint16
		}{{&hp.ike4, hp.peer4, 500}, {&hp.natt4, hp.peer4, 4500}, {&hp.ike6, hp.peer6, 500}, {&hp.natt6, hp.peer6, 4500}} {
			c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(l.addr, l.port)))
			if err != nil {
				return err
			}
			*l.c = c
			t.Cleanup(func() { c.Close() })
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if gone, err := run.exited(); gone {
			t.Fatalf("daemon exited at start: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("control socket did not appear")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return d, sock, hp
}

// ikeClient is a raw control connection registered for the hand-off.
type ikeClient struct {
	t  *testing.T
	nc net.Conn
}

func (c *ikeClient) send(typ wire.MsgType, seq uint32, fill func(*wire.Builder)) {
	c.t.Helper()
	b := wire.NewBuilder(wire.Version, typ, 0, seq)
	if fill != nil {
		fill(b)
	}
	msg, err := b.Bytes()
	if err != nil {
		c.t.Fatal(err)
	}
	c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.nc.Write(msg); err != nil {
		c.t.Fatal(err)
	}
}

// read returns the next message, or nil if none arrives within wait.
func (c *ikeClient) read(wait time.Duration) *wire.Message {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(wait))
	m, _, _, err := control.ReadMessage(c.nc, nil)
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return nil
		}
		c.t.Fatal(err)
	}
	return m
}

// packet decodes an IKE_PACKET's addresses and payload.
func packet(t *testing.T, m *wire.Message) (src, dst netip.AddrPort, data []byte) {
	t.Helper()
	var sa, da netip.Addr
	var sp, dp uint16
	for _, a := range m.Attrs {
		switch a.Type {
		case wire.AttrSrc:
			sa, _ = netip.AddrFromSlice(a.Value)
		case wire.AttrDst:
			da, _ = netip.AddrFromSlice(a.Value)
		case wire.AttrIKEPorts:
			sp, dp = uint16(a.Value[0])<<8|uint16(a.Value[1]), uint16(a.Value[2])<<8|uint16(a.Value[3])
		case wire.AttrIKEData:
			data = a.Value
		}
	}
	return netip.AddrPortFrom(sa, sp), netip.AddrPortFrom(da, dp), data
}

// TestIKEHandoff: IKE arriving on 500 and non-ESP-marked datagrams on 4500
// reach the registered client with their addresses; ESP and keepalives on
// 4500 do not; the client's datagrams leave from the port it names, and
// ESP from the NAT-T port is refused.
func TestIKEHandoff(t *testing.T) {
	_, sock, peer := startHandoff(t, nil)
	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := &ikeClient{t: t, nc: nc}
	c.send(wire.MsgIKERegister, 1, nil)
	if m := c.read(5 * time.Second); m == nil || m.Type != wire.MsgIKERegister || m.Flags != wire.FlagReply {
		t.Fatalf("IKE_REGISTER reply: %+v", m)
	}

	// An IKE header (28 bytes: SPIs, next payload, version 2.0,
	// IKE_SA_INIT, flags, message ID, length) and a little more.
	ike := []byte{1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0, 33, 0x20, 34, 0x08, 0, 0, 0, 0, 0, 0, 0, 32, 0xaa, 0xbb, 0xcc, 0xdd}
	marked := append([]byte{0, 0, 0, 0}, ike...)
	esp := []byte{0xc0, 0, 0, 1, 0, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8}
	send := func(seq uint32, src netip.Addr, sport uint16, dst netip.AddrPort, data []byte) {
		c.send(wire.MsgIKEPacket, seq, func(b *wire.Builder) {
			b.Addr(wire.AttrSrc, src)
			b.Addr(wire.AttrDst, dst.Addr())
			b.U16Pair(wire.AttrIKEPorts, sport, dst.Port())
			b.Raw(wire.AttrIKEData, data)
		})
	}
	recv := func(conn *net.UDPConn, wantFrom netip.AddrPort, want []byte) {
		t.Helper()
		buf := make([]byte, 2048)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatal(err)
		}
		if from != wantFrom || !bytes.Equal(buf[:n], want) {
			t.Fatalf("peer got %x from %v, want %x from %v", buf[:n], from, want, wantFrom)
		}
	}
	seq := uint32(10)
	for _, f := range []struct {
		daemon, peerAddr netip.Addr
		ike, natt        *net.UDPConn
	}{{peer.daemon4, peer.peer4, peer.ike4, peer.natt4}, {peer.daemon6, peer.peer6, peer.ike6, peer.natt6}} {
		daemon500 := netip.AddrPortFrom(f.daemon, 500)
		daemon4500 := netip.AddrPortFrom(f.daemon, 4500)
		peer500 := netip.AddrPortFrom(f.peerAddr, 500)
		peer4500 := netip.AddrPortFrom(f.peerAddr, 4500)

		// peer -> daemon
		if _, err := f.ike.WriteToUDPAddrPort(ike, daemon500); err != nil {
			t.Fatal(err)
		}
		m := c.read(5 * time.Second)
		if m == nil || m.Type != wire.MsgIKEPacket || m.Flags != 0 || m.Seq != 1 {
			t.Fatalf("want IKE_PACKET seq 1 for the datagram on %v, got %+v", daemon500, m)
		}
		if src, dst, data := packet(t, m); src != peer500 || dst != daemon500 || !bytes.Equal(data, ike) {
			t.Fatalf("datagram on 500 handed over as %v -> %v %x", src, dst, data)
		}
		for _, p := range [][]byte{esp, {0xff}, marked} {
			if _, err := f.natt.WriteToUDPAddrPort(p, daemon4500); err != nil {
				t.Fatal(err)
			}
		}
		m = c.read(5 * time.Second)
		if m == nil || m.Type != wire.MsgIKEPacket {
			t.Fatalf("want the marked datagram on %v, got %+v", daemon4500, m)
		}
		if src, dst, data := packet(t, m); src != peer4500 || dst != daemon4500 || !bytes.Equal(data, marked) {
			t.Fatalf("datagram on 4500 handed over as %v -> %v %x (ESP or keepalive leaked?)", src, dst, data)
		}
		if m := c.read(300 * time.Millisecond); m != nil {
			t.Fatalf("unexpected message %v (ESP or keepalive handed over?)", m.Type)
		}

		// daemon -> peer, from each port; no reply on success.
		send(seq, f.daemon, 500, peer500, ike)
		recv(f.ike, daemon500, ike)
		send(seq+1, f.daemon, 4500, peer4500, marked)
		recv(f.natt, daemon4500, marked)
		seq += 2
		if m := c.read(300 * time.Millisecond); m != nil {
			t.Fatalf("IKE_PACKET that was sent got a reply: %v", m.Type)
		}
	}
	// ESP from the NAT-T port, and a port that is not IKE's, are refused.
	send(20, peer.daemon4, 4500, netip.AddrPortFrom(peer.peer4, 4500), esp)
	send(21, peer.daemon6, 4501, netip.AddrPortFrom(peer.peer6, 4500), marked)
	for _, seq := range []uint32{20, 21} {
		m := c.read(5 * time.Second)
		if m == nil || m.Type != wire.MsgError || m.Seq != seq {
			t.Fatalf("want ERROR seq %d, got %+v", seq, m)
		}
	}
}

// TestIKEOverlong: datagrams on the IKE port longer than an IKE_PACKET
// message carries are dropped, counted in espd_ike_undelivered_total and
// logged at most once every 10 s with the count held back, whoever sends
// them and however many; the longest that fits (65,492 bytes over IPv4,
// 65,468 over IPv6: ikehub's TestMaxIKEData) still reaches the IKE daemon.
func TestIKEOverlong(t *testing.T) {
	logs := &testbed.Logs{}
	d, sock, peer := startHandoff(t, logs.Logger())
	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := &ikeClient{t: t, nc: nc}
	c.send(wire.MsgIKERegister, 1, nil)
	if m := c.read(5 * time.Second); m == nil || m.Type != wire.MsgIKERegister {
		t.Fatalf("IKE_REGISTER reply: %+v", m)
	}
	hub := d.ike.Load()
	undelivered := func() int { _, n := hub.Stats(); return int(n) }
	// The control socket's own warning for a datagram it could not
	// forward, which the hub must never let through.
	controlWarns := func() int {
		n := 0
		for _, r := range logs.All() {
			if strings.HasPrefix(r.Message, "control: IKE packet from") {
				n++
			}
		}
		return n
	}

	const burst = 20
	start := time.Now()
	dropped := 0
	for _, f := range []struct {
		ike      *net.UDPConn
		daemon   netip.Addr
		longest  int
		udpLimit int
	}{{peer.ike4, peer.daemon4, 65492, 65507}, {peer.ike6, peer.daemon6, 65468, 65527}} {
		to := netip.AddrPortFrom(f.daemon, 500)
		fits := bytes.Repeat([]byte{0xa5}, f.longest)
		if _, err := f.ike.WriteToUDPAddrPort(fits, to); err != nil {
			t.Fatal(err)
		}
		m := c.read(10 * time.Second)
		if m == nil || m.Type != wire.MsgIKEPacket {
			t.Fatalf("the longest datagram that fits (%d bytes to %v) was not handed over: %+v", f.longest, to, m)
		}
		if _, _, data := packet(t, m); !bytes.Equal(data, fits) {
			t.Fatalf("handed over %d bytes of %d", len(data), len(fits))
		}
		// One at a time, so that the daemon's socket buffer holds them.
		for i := range burst {
			size := f.longest + 1 + i%(f.udpLimit-f.longest)
			if _, err := f.ike.WriteToUDPAddrPort(make([]byte, size), to); err != nil {
				t.Fatal(err)
			}
			dropped++
			deadline := time.Now().Add(10 * time.Second)
			for undelivered()+controlWarns() < dropped {
				if time.Now().After(deadline) {
					t.Fatalf("datagram %d of %d bytes neither counted nor logged within 10 s", i, size)
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	elapsed := time.Since(start)
	if n := controlWarns(); n != 0 {
		t.Errorf("%d over-long datagrams reached the control socket and logged %d warnings", dropped, n)
	}
	if m := c.read(300 * time.Millisecond); m != nil {
		t.Errorf("an over-long datagram was handed over: %v", m.Type)
	}
	if n := sampleValue(t, scrape(t, d.metricsHandler()), "espd_ike_undelivered_total"); n != uint64(dropped) {
		t.Errorf("espd_ike_undelivered_total = %d after %d over-long datagrams", n, dropped)
	}
	lines := logs.Records("IKE datagram dropped")
	if max := 1 + int(elapsed/(10*time.Second)); len(lines) < 1 || len(lines) > max {
		t.Fatalf("%d over-long datagrams in %v logged %d lines, want 1 to %d", dropped, elapsed, len(lines), max)
	}
	held := 0
	for _, r := range lines {
		v, ok := testbed.Attr(r, "suppressed")
		if !ok || r.Level != slog.LevelWarn {
			t.Fatalf("%v line without a suppressed count: %v", r.Level, r.Message)
		}
		held += int(v.Uint64())
	}
	if held+len(lines) > dropped {
		t.Errorf("lines report %d held back, %d lines, for %d datagrams", held, len(lines), dropped)
	}
}
