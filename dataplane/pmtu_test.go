package dataplane

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"sort"
	"testing"

	"golang.org/x/net/ipv6"

	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

// reassemble joins the outer fragments of one packet (IPv4, or IPv6 with a
// Fragment header right after the fixed header) back into the packet.
func reassemble(t *testing.T, frags [][]byte) []byte {
	t.Helper()
	type piece struct {
		off  int
		data []byte
	}
	var pieces []piece
	var hdr []byte
	v6 := frags[0][0]>>4 == 6
	var nh byte
	for _, f := range frags {
		if !v6 {
			h, err := packet.ParseIPv4Header(f)
			if err != nil {
				t.Fatal(err)
			}
			if h.FragOffset == 0 {
				hdr = append([]byte(nil), f[:h.HeaderLen]...)
			}
			pieces = append(pieces, piece{int(h.FragOffset), f[h.HeaderLen:h.TotalLen]})
			continue
		}
		if f[6] != packet.ProtoFragment {
			t.Fatalf("IPv6 fragment without a Fragment header")
		}
		fo := binary.BigEndian.Uint16(f[42:44])
		if fo&^7 == 0 {
			hdr = append([]byte(nil), f[:packet.IPv6HeaderLen]...)
			nh = f[40]
		}
		pieces = append(pieces, piece{int(fo &^ 7), f[48:]})
	}
	sort.Slice(pieces, func(i, j int) bool { return pieces[i].off < pieces[j].off })
	var payload []byte
	for _, p := range pieces {
		if p.off != len(payload) {
			t.Fatalf("fragment at %d, expected %d", p.off, len(payload))
		}
		payload = append(payload, p.data...)
	}
	out := append(hdr, payload...)
	if v6 {
		out[6] = nh
		binary.BigEndian.PutUint16(out[4:6], uint16(len(payload)))
	} else {
		binary.BigEndian.PutUint16(out[2:4], uint16(len(out)))
		binary.BigEndian.PutUint16(out[6:8], 0)
		out[10], out[11] = 0, 0
		binary.BigEndian.PutUint16(out[10:12], packet.Checksum(out[:20], 0))
	}
	return out
}

func TestPathMTU(t *testing.T) {
	const outerMTU = 1400
	h := newHarness(t, Config{OuterMTU: outerMTU, ICMPRate: 1000}, false)
	out4, _ := h.add(tunnel{reqid: 1, spi: 0x100, dst: netip.MustParsePrefix("198.19.1.0/24")})
	out6, _ := h.add(tunnel{reqid: 2, spi: 0x200, dst: netip.MustParsePrefix("2001:db8:2::/48")})
	h.add(tunnel{reqid: 3, spi: 0x300, dst: netip.MustParsePrefix("198.19.3.0/24"), local: local6, peer: peer6, sport: 4500, dport: 4500})
	mtu4 := out4.Encapsulator().InnerMTU(outerMTU)
	mtu6 := out6.Encapsulator().InnerMTU(outerMTU)
	dst4, dst6 := netip.MustParseAddr("198.19.1.1"), netip.MustParseAddr("2001:db8:2::1")

	// Exactly the inner MTU fits in one outer packet of at most outerMTU.
	if p := h.oneOut(udpPacket(innerSrc4, dst4, 1, 2, 0, mtu4, true)); len(p) > outerMTU {
		t.Errorf("outer packet of %d bytes for an inner packet of the inner MTU %d", len(p), mtu4)
	}

	// One more byte with DF: "fragmentation needed" with the inner MTU.
	big := udpPacket(innerSrc4, dst4, 1, 2, 0, mtu4+1, true)
	h.tun.in <- [][]byte{big}
	waitFor(t, "an ICMP error", func() bool { return len(h.tun.packets()) == 1 })
	icmp := h.tun.packets()[0]
	ip, err := packet.ParseIPv4Header(icmp)
	if err != nil || ip.Protocol != packet.ProtoICMP || ip.Src != dst4 || ip.Dst != innerSrc4 {
		t.Fatalf("ICMP packet header %+v, %v", ip, err)
	}
	m := icmp[ip.HeaderLen:]
	if m[0] != packet.ICMPv4DestUnreach || m[1] != packet.ICMPv4FragNeededCode || int(binary.BigEndian.Uint16(m[6:8])) != mtu4 {
		t.Errorf("ICMP type %d code %d MTU %d, want 3/4/%d", m[0], m[1], binary.BigEndian.Uint16(m[6:8]), mtu4)
	}
	if !bytes.Equal(m[8:28], big[:20]) {
		t.Error("ICMP error does not quote the packet's header")
	}

	// IPv6: packet too big with the inner MTU.
	h.tun.in <- [][]byte{udpPacket(innerSrc6, dst6, 1, 2, 0, mtu6+1, false)}
	waitFor(t, "an ICMPv6 error", func() bool { return len(h.tun.packets()) == 2 })
	icmp6 := h.tun.packets()[1]
	ip6, err := ipv6.ParseHeader(icmp6)
	if err != nil || ip6.Version != 6 || packet.IPv6HeaderLen+ip6.PayloadLen > len(icmp6) ||
		ip6.NextHeader != packet.ProtoICMPv6 || !ip6.Src.Equal(dst6.AsSlice()) || !ip6.Dst.Equal(innerSrc6.AsSlice()) {
		t.Fatalf("ICMPv6 header %v, %v", ip6, err)
	}
	m6 := icmp6[packet.IPv6HeaderLen:]
	if m6[0] != packet.ICMPv6PacketTooBigMsg || int(binary.BigEndian.Uint32(m6[4:8])) != mtu6 {
		t.Errorf("ICMPv6 type %d MTU %d, want 2/%d", m6[0], binary.BigEndian.Uint32(m6[4:8]), mtu6)
	}
	// Each too-big packet is a drop of its state.
	waitFor(t, "the too-big drops", func() bool {
		return out4.Stats().Drops[sa.DropTooBig] == 1 && out6.Stats().Drops[sa.DropTooBig] == 1
	})
	for _, s := range []*sa.SA{out4, out6} {
		if d := s.Stats().Drops; d != ([sa.NumDropReasons]uint64{sa.DropTooBig: 1}) {
			t.Errorf("%v: drops %v, want one too-big", s, d)
		}
	}
	if st := waitStats(t, h.d, "the ICMP errors counted", func(st Stats) bool { return st.ICMPSent >= 2 }); st.ICMPSent != 2 {
		t.Errorf("ICMPSent %d, want 2", st.ICMPSent)
	}
	if n := len(h.tx.packets()); n != 1 {
		t.Errorf("%d packets sent, want only the one that fit", n)
	}

	// Without DF the outer packet is fragmented, IPv4 outside ...
	for _, tc := range []struct {
		name string
		dst  netip.Addr
		v6   bool
	}{
		{"IPv4 outer", dst4, false},
		{"IPv6 outer", netip.MustParseAddr("198.19.3.3"), true},
	} {
		inner := udpPacket(innerSrc4, tc.dst, 1, 2, 7, 1400, false)
		before := len(h.tx.packets())
		h.tun.in <- [][]byte{inner}
		waitFor(t, "fragments", func() bool { return len(h.tx.packets()) >= before+2 })
		frags := h.tx.packets()[before:]
		for _, f := range frags {
			if len(f) > outerMTU {
				t.Errorf("%s: fragment of %d bytes", tc.name, len(f))
			}
			if (f[0]>>4 == 6) != tc.v6 {
				t.Errorf("%s: fragment of IP version %d", tc.name, f[0]>>4)
			}
		}
		// ... and what the peer reassembles decrypts to the packet.
		n := h.tun.count.Load()
		h.wire.inject(reassemble(t, frags))
		waitFor(t, "the reassembled packet", func() bool { return h.tun.count.Load() == n+1 })
		if got := h.tun.packets()[n]; !bytes.Equal(got, inner) {
			t.Errorf("%s: reassembled and decrypted packet differs", tc.name)
		}
	}
	if st := waitStats(t, h.d, "the fragments counted", func(st Stats) bool { return st.Fragments >= 4 }); st.Fragments != 4 {
		t.Errorf("Fragments = %d, want 4", st.Fragments)
	}
}

func TestICMPRateLimit(t *testing.T) {
	h := newHarness(t, Config{OuterMTU: 1400, ICMPRate: 2}, false)
	out, _ := h.add(tunnel{reqid: 1, spi: 0x100, dst: netip.MustParsePrefix("198.19.1.0/24")})
	var batch [][]byte
	for i := range 5 {
		batch = append(batch, udpPacket(innerSrc4, netip.MustParseAddr("198.19.1.1"), 1, 2, uint64(i), 1400, true))
	}
	h.tun.in <- batch
	waitFor(t, "five too-big packets", func() bool {
		st := h.d.Stats()
		return out.Stats().Drops[sa.DropTooBig] == 5 && st.ICMPSent+st.ICMPLimited == 5
	})
	if st := h.d.Stats(); st.ICMPSent != 2 || st.ICMPLimited != 3 {
		t.Errorf("ICMPSent %d ICMPLimited %d, want 2 and 3", st.ICMPSent, st.ICMPLimited)
	}
}

func TestIPv6MinimumMTU(t *testing.T) {
	h := newHarness(t, Config{OuterMTU: 1300}, false)
	out, _ := h.add(tunnel{reqid: 1, spi: 0x100, dst: netip.MustParsePrefix("2001:db8:2::/48")})
	if m := out.Encapsulator().InnerMTU(1300); m >= minIPv6MTU {
		t.Fatalf("inner MTU %d: the test needs one below 1280", m)
	}
	dst := netip.MustParseAddr("2001:db8:2::1")
	inner := udpPacket(innerSrc6, dst, 1, 2, 0, minIPv6MTU, false)
	h.tun.in <- [][]byte{inner}
	waitFor(t, "fragments", func() bool { return len(h.tx.packets()) == 2 })
	frags := h.tx.packets()
	for _, f := range frags {
		if len(f) > 1300 || binary.BigEndian.Uint16(f[6:8])&packet.IPv4DontFragment != 0 {
			t.Errorf("fragment of %d bytes, flags %#x", len(f), f[6])
		}
		if _, err := packet.ParseIPv4Header(f); err != nil {
			t.Errorf("fragment header: %v", err)
		}
	}
	h.wire.inject(reassemble(t, frags))
	waitFor(t, "the decrypted packet", func() bool { return h.tun.count.Load() == 1 })
	if !bytes.Equal(h.tun.packets()[0], inner) {
		t.Error("decrypted packet differs")
	}
	h.tun.in <- [][]byte{udpPacket(innerSrc6, dst, 1, 2, 0, minIPv6MTU+1, false)}
	waitFor(t, "a packet too big", func() bool { return h.tun.count.Load() == 2 })
	m6 := h.tun.packets()[1][packet.IPv6HeaderLen:]
	if m6[0] != packet.ICMPv6PacketTooBigMsg || binary.BigEndian.Uint32(m6[4:8]) != minIPv6MTU {
		t.Errorf("ICMPv6 type %d MTU %d, want 2/1280", m6[0], binary.BigEndian.Uint32(m6[4:8]))
	}
}
