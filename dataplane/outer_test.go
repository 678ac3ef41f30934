package dataplane

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/packet"
)

func TestKeepalives(t *testing.T) {
	h := newHarness(t, Config{Keepalive: -1}, false)
	h.add(tunnel{reqid: 1, spi: 0x100, dst: netip.MustParsePrefix("198.19.1.0/24"), sport: 4500, dport: 4501})
	h.add(tunnel{reqid: 2, spi: 0x200, dst: netip.MustParsePrefix("198.19.2.0/24")}) // raw: none
	h.add(tunnel{reqid: 3, spi: 0x300, dst: netip.MustParsePrefix("2001:db8:3::/48"), local: local6, peer: peer6, sport: 4500, dport: 4502})
	if n := h.d.sendKeepalives(); n != 2 {
		t.Fatalf("sent %d keepalives, want 2", n)
	}
	got := map[uint16]bool{}
	for _, p := range h.tx.packets() {
		var m conn.Message
		m.Buf = make([]byte, 2048)
		deliver(&m, p)
		if m.Err != nil || !m.UDP || !bytes.Equal(m.Buf[m.Start:m.End], []byte{0xff}) || m.Src.Port() != 4500 {
			t.Errorf("keepalive %+v", m)
			continue
		}
		if p[0]>>4 == 6 {
			u := p[packet.IPv6HeaderLen:] // deliver checked its length field
			u = u[:binary.BigEndian.Uint16(u[4:6])]
			if binary.BigEndian.Uint16(u[6:8]) == 0 || packet.Checksum(u, packet.PseudoHeaderSum(packet.ProtoUDP, m.Src.Addr(), m.Dst.Addr(), len(u))) != 0 {
				t.Error("IPv6 keepalive UDP checksum invalid")
			}
		}
		got[m.Dst.Port()] = true
	}
	if !got[4501] || !got[4502] {
		t.Errorf("keepalives to ports %v", got)
	}
	if h.d.Stats().KeepalivesTx != 2 {
		t.Errorf("KeepalivesTx = %d", h.d.Stats().KeepalivesTx)
	}
}

func TestKeepaliveTimer(t *testing.T) {
	h := newHarness(t, Config{Keepalive: 20 * time.Millisecond}, false)
	h.add(tunnel{reqid: 1, spi: 0x100, dst: netip.MustParsePrefix("198.19.1.0/24"), sport: 4500, dport: 4500})
	waitFor(t, "two timed keepalives", func() bool { return h.d.Stats().KeepalivesTx >= 2 })
}

// TestIKEOnEncapPortGoesToHandOff: a non-ESP-marked datagram that arrives
// on the encapsulation port is handed to IO.DeliverIKE (here the fake's
// IKE hand-off) and counted; a NAT keepalive is counted and dropped;
// neither reaches the TUN.
func TestIKEOnEncapPortGoesToHandOff(t *testing.T) {
	h := newHarness(t, Config{}, false)
	got := make(chan conn.IKEPacket, 1)
	if err := h.tx.StartIKE(500, func(p conn.IKEPacket) {
		got <- conn.IKEPacket{Src: p.Src, Dst: p.Dst, Data: append([]byte(nil), p.Data...)}
	}); err != nil {
		t.Fatal(err)
	}
	datagram := func(payload []byte) []byte {
		buf := make([]byte, conn.HeaderRoom+len(payload))
		copy(buf[conn.HeaderRoom:], payload)
		ip, err := packet.PutTunnelHeader(buf, conn.HeaderRoom, len(buf), packet.TunnelHeader{
			Src: peer4, Dst: local4, SrcPort: 4500, DstPort: conn.DefaultEncapPort, TTL: 64,
		})
		if err != nil {
			t.Fatal(err)
		}
		return ip
	}
	ike := make([]byte, esp.NonESPMarkerLen+28) // the marker and an IKE header
	copy(ike[esp.NonESPMarkerLen:], "IKE SPIs and the rest")
	h.wire.inject(datagram(ike))
	select {
	case p := <-got:
		if !bytes.Equal(p.Data, ike) || p.Src != netip.AddrPortFrom(peer4, 4500) || p.Dst != netip.AddrPortFrom(local4, conn.DefaultEncapPort) {
			t.Errorf("handed %+v", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the IKE datagram did not reach the Bind's hand-off: %+v", h.d.Stats())
	}
	h.wire.inject(datagram([]byte{0xff}))
	waitFor(t, "the keepalive counted", func() bool { return h.d.Stats().KeepalivesRx == 1 })
	if st := h.d.Stats(); st.IKE != 1 || h.tx.IKEStats().Received != 1 || h.tun.count.Load() != 0 {
		t.Errorf("IKE %d, handed %d, TUN writes %d; want 1, 1, 0", st.IKE, h.tx.IKEStats().Received, h.tun.count.Load())
	}
}

// failingReceiver fails its first reads with a transient error, then
// blocks until closed, as a socket would.
type failingReceiver struct {
	fails     atomic.Int32
	closed    chan struct{}
	closeOnce sync.Once
}

func (r *failingReceiver) Receive(msgs []conn.Message) (int, error) {
	if r.fails.Add(-1) >= 0 {
		return 0, errTransientRead
	}
	<-r.closed
	return 0, os.ErrClosed
}

func (r *failingReceiver) Close() error {
	r.closeOnce.Do(func() { close(r.closed) })
	return nil
}

// TestReadErrorsCounted: a read that fails is counted in ReadErrors and
// the reader goes on reading (after a pause), rather than stopping.
func TestReadErrorsCounted(t *testing.T) {
	rx := &failingReceiver{closed: make(chan struct{})}
	rx.fails.Store(3)
	h := newHarnessWith(t, Config{}, false, rx)
	waitFor(t, "three read errors", func() bool { return h.d.Stats().ReadErrors == 3 })
	waitFor(t, "the reader to read again after them", func() bool { return rx.fails.Load() < 0 })
}
