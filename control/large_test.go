package control

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	sockets "github.com/espd/espd/conn"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
)

// ikePacketOfSize returns an IKE_PACKET message of exactly size bytes
// (a multiple of 4), its payload a pattern that starts with seq.
func ikePacketOfSize(t *testing.T, seq uint32, size int) ([]byte, sockets.IKEPacket) {
	t.Helper()
	p := sockets.IKEPacket{Src: ikeLocal, Dst: ikePeer}
	overhead := len(encode(t, wire.MsgIKEPacket, 0, seq, func(b *wire.Builder) { putIKE(b, p) }))
	p.Data = make([]byte, size-overhead)
	for i := range p.Data {
		p.Data[i] = byte(int(seq) + i)
	}
	msg := encode(t, wire.MsgIKEPacket, 0, seq, func(b *wire.Builder) { putIKE(b, p) })
	if len(msg) != size {
		t.Fatalf("IKE_PACKET of %d bytes, want %d", len(msg), size)
	}
	return msg, p
}

// TestLargeMessages sends messages above the server's initial 4 KiB read
// buffer as the very first message of a connection, and then messages
// that grow and shrink on one connection: each must arrive whole (before
// the fix the first large one failed with "bad magic 0x0000").
func TestLargeMessages(t *testing.T) {
	b, path := startIKEServer(t)
	sizes := []int{initialReadBuffer + 4, wire.MaxMessageSize}
	// The first message of a connection: SA_ADD with 200 selectors (above
	// 4 KiB), and with as many as fit in MaxMessageSize.
	saAdd := func(cfg sa.Config) ([]byte, error) {
		b := wire.NewBuilder(wire.Version, wire.MsgSAAdd, 0, 1)
		wire.PutSAAdd(b, cfg)
		return b.Bytes()
	}
	most, over := 200, 2000 // fits, does not fit
	for over-most > 1 {
		if mid := (most + over) / 2; func() bool { _, err := saAdd(manySelectors(1, mid)); return err == nil }() {
			most = mid
		} else {
			over = mid
		}
	}
	for i, n := range []int{200, most} {
		r := rawDial(t, path)
		cfg := manySelectors(0x5000+uint32(i), n)
		msg, err := saAdd(cfg)
		if err != nil || len(msg) <= initialReadBuffer {
			t.Fatalf("SA_ADD with %d selectors: %d bytes, %v", n, len(msg), err)
		}
		r.send(msg)
		m, err := r.read()
		if err != nil || m.Type != wire.MsgSAAdd || m.Flags != wire.FlagReply || m.Seq != 1 {
			if m != nil && m.Type == wire.MsgError {
				e, _ := wire.ReadError(m.Attrs)
				t.Fatalf("SA_ADD of %d bytes as the first message: %v", len(msg), e)
			}
			t.Fatalf("SA_ADD of %d bytes as the first message: %v %v", len(msg), m, err)
		}
		s, ok := b.db.GetSA(cfg.SPI, cfg.Dst)
		if !ok || len(s.Config().Selectors) != n {
			t.Fatalf("SA_ADD of %d bytes: state missing or selectors lost", len(msg))
		}
		t.Logf("SA_ADD with %d selectors, %d bytes: installed", n, len(msg))
	}
	// Exact sizes, first on a connection: IKE_PACKET through the hand-off.
	for _, size := range sizes {
		r := rawDial(t, path)
		msg, _ := ikePacketOfSize(t, 2, size)
		r.send(msg) // before IKE_REGISTER: refused, but read whole
		r.wantError(2, wire.EPROTO)
		r.wantUsable(3)
	}

	// Growing and shrinking on one registered connection, both ways.
	r := rawDial(t, path)
	register(t, r, 1)
	sess := b.current()
	for i, size := range []int{64, initialReadBuffer + 4, 200, 60 * 1024, 4096, wire.MaxMessageSize, 48, 20000, 16 + 64} {
		seq := uint32(10 + i)
		msg, p := ikePacketOfSize(t, seq, size)
		r.send(msg)
		select {
		case got := <-b.sent:
			if got.Dst != p.Dst || !bytes.Equal(got.Data, p.Data) {
				t.Fatalf("IKE_PACKET of %d bytes: got %d bytes of payload, want %d", size, len(got.Data), len(p.Data))
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("IKE_PACKET of %d bytes not handed over", size)
		}
		// And espd -> client, a datagram of the same payload.
		in := sockets.IKEPacket{Src: ikePeer, Dst: ikeLocal, Data: p.Data}
		sess.deliver(t, in)
		m, err := r.read()
		if err != nil || m.Type != wire.MsgIKEPacket {
			t.Fatalf("forwarded IKE_PACKET of %d bytes: %v %v", size, m, err)
		}
		fwd, err := readIKE(m.Attrs)
		if err != nil || !bytes.Equal(fwd.Data, in.Data) {
			t.Fatalf("forwarded IKE_PACKET of %d bytes: %v", size, err)
		}
		r.wantUsable(uint32(100 + i))
	}
}

// manySelectors returns an inbound state with n selectors.
func manySelectors(spi uint32, n int) sa.Config {
	c := sa.DefaultConfig()
	c.SPI, c.Dir = spi, sa.DirIn
	c.Src, c.Dst = netip.MustParseAddr("2001:db8::2"), netip.MustParseAddr("2001:db8::1")
	c.Suite = crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128}
	c.EncKey, c.IntegKey = make([]byte, 20), []byte{}
	binary.BigEndian.PutUint32(c.EncKey, spi) // a key of its own
	c.EncKey[4] = byte(n)
	for i := range n {
		c.Selectors = append(c.Selectors, sa.Selector{
			Src:   netip.MustParsePrefix(fmt.Sprintf("2001:db8:%x::/48", i+1)),
			Dst:   netip.MustParsePrefix(fmt.Sprintf("2001:db8:%x:%x::/64", 0x8000+i, i)),
			Proto: 6, DstPorts: sa.PortRange{Lo: uint16(i + 1), Hi: uint16(i + 1)},
		})
	}
	return c
}

// TestClientLargeSA adds a state with 200 selectors through the Client:
// its SA_ADD is the connection's first message above 4 KiB; the SA_GET
// reply is as large the other way.
func TestClientLargeSA(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := dial(t, ts.path)
	cfg := manySelectors(0x6001, 200)
	msg := encode(t, wire.MsgSAAdd, 0, 1, func(b *wire.Builder) { wire.PutSAAdd(b, cfg) })
	if len(msg) <= initialReadBuffer {
		t.Fatalf("SA_ADD of %d bytes is not above 4 KiB", len(msg))
	}
	if err := c.AddSA(testCtx(t), cfg); err != nil {
		t.Fatalf("SA_ADD of %d bytes: %v", len(msg), err)
	}
	in, err := c.GetSA(testCtx(t), cfg.SPI, cfg.Dst)
	if err != nil || len(in.Config.Selectors) != 200 || in.Config.Selectors[199] != cfg.Selectors[199] {
		t.Fatalf("SA_GET: %v, %d selectors", err, len(in.Config.Selectors))
	}
	// Smaller messages on the same connection still work.
	if _, err := c.Stats(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}
