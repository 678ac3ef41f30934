package esp

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/net/ipv6"

	"github.com/espd/espd/packet"
)

// innerV4 returns an IPv4 UDP packet of n bytes (n >= 28) with the given
// TOS and DF bit and a recognisable payload.
func innerV4(n int, tos uint8, df bool) []byte {
	p := make([]byte, n)
	packet.PutIPv4Header(p, packet.IPv4Header{TOS: tos, TotalLen: uint16(n), ID: 7, DF: df, TTL: 9,
		Protocol: packet.ProtoUDP, Src: netip.MustParseAddr("198.18.10.1"), Dst: netip.MustParseAddr("198.18.20.1")})
	packet.PutUDPHeader(p[20:], 1111, 2222, n-28)
	for i := 28; i < n; i++ {
		p[i] = byte(i*31 + 5)
	}
	return p
}

// innerV6 returns an IPv6 UDP packet of n bytes (n >= 48) with the given
// traffic class.
func innerV6(n int, tc uint8) []byte {
	p := make([]byte, n)
	packet.PutIPv6Header(p, packet.IPv6Header{TrafficClass: tc, FlowLabel: 0x12345, PayloadLen: uint16(n - 40),
		NextHeader: packet.ProtoUDP, HopLimit: 9,
		Src: netip.MustParseAddr("2001:db8:10::1"), Dst: netip.MustParseAddr("2001:db8:20::1")})
	packet.PutUDPHeader(p[40:], 1111, 2222, n-48)
	for i := 48; i < n; i++ {
		p[i] = byte(i*17 + 3)
	}
	return p
}

// inner returns an inner packet of the family v (4 or 6).
func inner(v, n int, tos uint8) []byte {
	if v == 4 {
		return innerV4(n, tos, false)
	}
	return innerV6(n, tos)
}

// place puts p at MaxHeadroom in a buffer with tail bytes of capacity
// behind it.
func place(p []byte, tail int) (buf []byte, off int) {
	b := make([]byte, MaxHeadroom+len(p)+tail)
	copy(b[MaxHeadroom:], p)
	return b[:MaxHeadroom+len(p)], MaxHeadroom
}

type outerCase struct {
	name string
	o    Outer
}

// outers are the four framings: raw ESP and ESP-in-UDP over IPv4 and IPv6.
func outers() []outerCase {
	a4, b4 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.19.0.1")
	a6, b6 := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8:1::1")
	return []outerCase{
		{"v4", Outer{Src: a4, Dst: b4}},
		{"v4udp", Outer{Src: a4, Dst: b4, SrcPort: 4500, DstPort: 4500}},
		{"v6", Outer{Src: a6, Dst: b6}},
		{"v6udp", Outer{Src: a6, Dst: b6, SrcPort: 4500, DstPort: 4501}},
	}
}

// frame writes the outer header of an encapsulated packet in front of it,
// as espd's raw sender does (packet.PutTunnelHeader with the fields
// Encapsulate returned, the Outer's addresses, ports and TTL, and the low
// 16 bits of seq as the IPv4 ID), and returns where the outer packet
// starts.
func frame(out []byte, p Packet, o Outer, seq uint64) int {
	h := packet.TunnelHeader{
		Src: o.Src, Dst: o.Dst, SrcPort: o.SrcPort, DstPort: o.DstPort, Protocol: packet.ProtoESP,
		TOS: p.TOS, TTL: o.TTLOrDefault(), DF: p.DF, ID: uint16(seq),
	}
	full, err := packet.PutTunnelHeader(out[:cap(out)], p.ESP, p.End, h)
	if err != nil {
		panic(fmt.Sprintf("the headroom Encapsulate left does not take the outer header: %v", err))
	}
	return p.End - len(full)
}

// wireLen returns the length of an encapsulated packet on the wire, outer
// headers included.
func wireLen(p Packet, o Outer) int {
	h := packet.TunnelHeader{Dst: o.Dst, DstPort: o.DstPort}
	return h.Len() + p.End - p.ESP
}

// checkOuter frames an encapsulated packet, verifies its outer headers and
// returns the outer TOS and the IPv4 header (zero for IPv6).
func checkOuter(out []byte, p Packet, o Outer, spi uint32, seq uint64) (uint8, packet.IPv4Header, error) {
	out = out[:cap(out)]
	b := out[frame(out, p, o, seq):p.End]
	var tos uint8
	var h4 packet.IPv4Header
	var proto uint8
	var l4 []byte
	if o.Src.Is4() {
		h, err := packet.ParseIPv4Header(b)
		if err != nil {
			return 0, h4, fmt.Errorf("outer IPv4 header: %v", err)
		}
		if int(h.TotalLen) != len(b) || h.Src != o.Src || h.Dst != o.Dst || h.MF || h.FragOffset != 0 || h.ID != uint16(seq) {
			return 0, h4, fmt.Errorf("outer IPv4 header %+v", h)
		}
		tos, proto, l4, h4 = h.TOS, h.Protocol, b[20:], h
		if h.TTL != o.TTL && !(o.TTL == 0 && h.TTL == 64) {
			return 0, h4, fmt.Errorf("TTL %d for Outer.TTL %d", h.TTL, o.TTL)
		}
	} else {
		h, err := ipv6.ParseHeader(b)
		if err != nil {
			return 0, h4, fmt.Errorf("outer IPv6 header: %v", err)
		}
		src, _ := netip.AddrFromSlice(h.Src)
		dst, _ := netip.AddrFromSlice(h.Dst)
		if h.Version != 6 || h.PayloadLen+40 != len(b) || src != o.Src || dst != o.Dst || h.FlowLabel != 0 {
			return 0, h4, fmt.Errorf("outer IPv6 header %v", h)
		}
		if h.HopLimit != int(o.TTL) && !(o.TTL == 0 && h.HopLimit == 64) {
			return 0, h4, fmt.Errorf("hop limit %d for Outer.TTL %d", h.HopLimit, o.TTL)
		}
		tos, proto, l4 = uint8(h.TrafficClass), uint8(h.NextHeader), b[40:]
	}
	if o.DstPort != 0 {
		if proto != packet.ProtoUDP {
			return 0, h4, fmt.Errorf("protocol %d, want UDP", proto)
		}
		if len(l4) < packet.UDPHeaderLen || int(binary.BigEndian.Uint16(l4[4:6])) != len(l4) ||
			binary.BigEndian.Uint16(l4[0:2]) != o.SrcPort || binary.BigEndian.Uint16(l4[2:4]) != o.DstPort {
			return 0, h4, fmt.Errorf("UDP header % x", l4[:min(len(l4), packet.UDPHeaderLen)])
		}
		check := binary.BigEndian.Uint16(l4[6:8])
		if o.Src.Is4() && check != 0 {
			return 0, h4, fmt.Errorf("UDP checksum %#x over IPv4, want 0", check)
		}
		if o.Src.Is6() && (check == 0 || packet.Checksum(l4, packet.PseudoHeaderSum(packet.ProtoUDP, o.Src, o.Dst, len(l4))) != 0) {
			return 0, h4, fmt.Errorf("UDP checksum invalid")
		}
		l4 = l4[packet.UDPHeaderLen:]
	} else if proto != packet.ProtoESP {
		return 0, h4, fmt.Errorf("protocol %d, want ESP", proto)
	}
	if &l4[0] != &out[p.ESP] {
		return 0, h4, fmt.Errorf("Packet.ESP does not point at the ESP header")
	}
	if binary.BigEndian.Uint32(l4) != spi || binary.BigEndian.Uint32(l4[4:]) != uint32(seq) {
		return 0, h4, fmt.Errorf("ESP header % x", l4[:8])
	}
	return tos, h4, nil
}
