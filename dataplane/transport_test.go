package dataplane

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

// hostPacket returns a UDP packet of size bytes from src to dst as this
// host's stack sends it to its transport-mode peer: TTL 61, DF, IPv4 ID
// 0x1234 or IPv6 flow label 0x54321, TOS 0xb8 (DSCP 46).
func hostPacket(src, dst netip.Addr, size int) []byte {
	p := udpPacket(src, dst, 1701, 1701, 7, size, true)
	if src.Is4() {
		p[1], p[8] = 0xb8, 61
		binary.BigEndian.PutUint16(p[4:6], 0x1234)
		binary.BigEndian.PutUint16(p[10:12], 0)
		binary.BigEndian.PutUint16(p[10:12], packet.Checksum(p[:packet.IPv4HeaderLen], 0))
		return p
	}
	binary.BigEndian.PutUint32(p[0:4], 6<<28|0xb8<<20|0x54321)
	p[7] = 61
	return p
}

// TestTransportMode: a transport-mode state sends a host's packet with
// the packet's own header fields and ESP in place of its UDP header, and
// the inbound state delivers the payload behind an IP header between its
// endpoints; over both families, raw and in UDP, AEAD and CBC, with and
// without workers. A datagram larger than the path goes in outer
// fragments whatever its DF bit, with an ID of its own.
func TestTransportMode(t *testing.T) {
	for _, c := range []struct {
		local, peer netip.Addr
		port        uint16
		suite       string
		workers     int
	}{
		{local4, peer4, 0, "aes128gcm16", 0},
		{local4, peer4, 4500, "aes256-sha256", 2},
		{local6, peer6, 0, "chacha20poly1305", 2},
		{local6, peer6, 4500, "aes128gcm16", 0},
	} {
		name := fmt.Sprintf("%v/port%d/%s/workers%d", c.local, c.port, c.suite, c.workers)
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, Config{Workers: c.workers}, false)
			_, in := h.add(tunnel{reqid: 3, spi: 0x3300, dst: netip.PrefixFrom(c.peer, c.peer.BitLen()),
				suite: c.suite, local: c.local, peer: c.peer, sport: c.port, dport: c.port, mode: sa.ModeTransport})
			hl := packet.IPv4HeaderLen
			if c.local.Is6() {
				hl = packet.IPv6HeaderLen
			}
			inner := hostPacket(c.local, c.peer, 300)
			outer := h.oneOut(inner)

			// The packet's own header, with ESP (or UDP) as its protocol.
			proto := packet.ProtoESP
			if c.port != 0 {
				proto = packet.ProtoUDP
			}
			if c.local.Is4() {
				ip, err := packet.ParseIPv4Header(outer)
				if err != nil {
					t.Fatal(err)
				}
				if ip.Src != c.local || ip.Dst != c.peer || ip.TTL != 61 || ip.ID != 0x1234 || !ip.DF || ip.TOS != 0xb8 || ip.Protocol != uint8(proto) {
					t.Errorf("outer header %+v", ip)
				}
			} else {
				if got := binary.BigEndian.Uint32(outer[0:4]); got != 6<<28|0xb8<<20|0x54321 || outer[7] != 61 || outer[6] != uint8(proto) {
					t.Errorf("outer IPv6 header % x", outer[:8])
				}
			}
			if bytes.Contains(outer, inner[hl+8:hl+40]) {
				t.Error("the payload went in clear")
			}

			// Delivered between the inbound state's endpoints: from the
			// peer to this host, the UDP datagram unchanged.
			h.wire.inject(outer)
			waitFor(t, "the decrypted packet", func() bool { return h.tun.count.Load() == 1 })
			got := h.tun.packets()[0]
			if len(got) != len(inner) || !bytes.Equal(got[hl:], inner[hl:]) {
				t.Fatalf("delivered % x\nwant payload % x", got, inner[hl:])
			}
			f, err := packet.ParseFlow(got)
			if err != nil || f.Src != c.peer || f.Dst != c.local || f.Proto != packet.ProtoUDP {
				t.Errorf("delivered flow %+v, %v", f, err)
			}
			if c.local.Is4() {
				if ip, err := packet.ParseIPv4Header(got); err != nil || ip.TTL != transportTTL || ip.TOS != 0xb8 {
					t.Errorf("delivered header %+v, %v", ip, err)
				}
			}
			if s := in.Stats(); s.Packets != 1 || totalDrops(s.Drops) != 0 {
				t.Errorf("inbound state: %+v", s)
			}

			// Larger than the path (DF set): outer fragments, DF clear,
			// the ID taken from the sequence number.
			before := len(h.tx.packets())
			h.tun.in <- [][]byte{hostPacket(c.local, c.peer, 3000)}
			waitFor(t, "fragments", func() bool { return len(h.tx.packets()) >= before+3 })
			for _, fr := range h.tx.packets()[before:] {
				if len(fr) > DefaultOuterMTU {
					t.Errorf("fragment of %d bytes", len(fr))
				}
				if c.local.Is4() {
					ip, _ := packet.ParseIPv4Header(fr)
					if ip.DF || ip.ID != 2 || ip.Protocol != uint8(proto) {
						t.Errorf("fragment header %+v", ip)
					}
				} else if fr[6] != packet.ProtoFragment {
					t.Errorf("IPv6 fragment without a fragment header: % x", fr[:8])
				}
			}
		})
	}
}

// TestTransportRefusals: a transport-mode state carries only its two
// hosts' own packets (a packet from another source is dropped and counted
// against it), and a state serves only policies of its mode.
func TestTransportRefusals(t *testing.T) {
	h := newHarness(t, Config{}, false)
	out, _ := h.add(tunnel{reqid: 4, spi: 0x3400, dst: netip.PrefixFrom(peer4, 32),
		local: local4, peer: peer4, mode: sa.ModeTransport})
	h.tun.in <- [][]byte{hostPacket(netip.MustParseAddr("198.18.9.9"), peer4, 200)}
	waitFor(t, "an inner drop", func() bool { return out.Stats().Drops[sa.DropInner] == 1 })

	// A tunnel-mode policy of the same reqid finds no state.
	other := netip.MustParseAddr("198.19.4.4")
	if _, err := h.db.AddPolicy(sa.Policy{Selector: sa.Selector{Dst: netip.PrefixFrom(other, 32)}, Dir: sa.DirOut,
		Action: sa.ActionProtect, ReqID: 4}); err != nil {
		t.Fatal(err)
	}
	h.tun.in <- [][]byte{udpPacket(local4, other, 1, 2, 1, 200, false)}
	waitFor(t, "no state for the tunnel-mode policy", func() bool { return h.d.Stats().NoSA == 1 })
	if n := len(h.tx.packets()); n != 0 {
		t.Errorf("%d packets sent", n)
	}
}
