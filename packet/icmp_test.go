package packet

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

func TestICMPv4FragNeeded(t *testing.T) {
	gw := netip.MustParseAddr("198.18.0.254")
	for _, plen := range []int{0, 5, 8, 100, 528, 529, 1480} {
		pkt := ipv4Packet("198.18.0.1", "198.19.0.2", ProtoTCP, []byte{1, 1, 1, 1}, ports(1000, 22, plen+20))
		binary.BigEndian.PutUint16(pkt[6:8], IPv4DontFragment)
		binary.BigEndian.PutUint16(pkt[10:12], 0)
		binary.BigEndian.PutUint16(pkt[10:12], refChecksum(pkt[:24]))
		dst := make([]byte, 2048)
		n, err := ICMPv4FragNeeded(dst, gw, pkt, 1400)
		if err != nil {
			t.Fatalf("plen %d: %v", plen, err)
		}
		wantQ := min(len(pkt), 576-28)
		if n != 28+wantQ {
			t.Fatalf("plen %d: length %d, want %d", plen, n, 28+wantQ)
		}
		h, err := ParseIPv4Header(dst[:n])
		if err != nil {
			t.Fatalf("outer header: %v", err)
		}
		if h.Src != gw || h.Dst != netip.MustParseAddr("198.18.0.1") || h.Protocol != ProtoICMP ||
			int(h.TotalLen) != n || h.TTL == 0 {
			t.Fatalf("outer header %+v", h)
		}
		m := dst[20:n]
		if m[0] != 3 || m[1] != 4 || binary.BigEndian.Uint16(m[6:8]) != 1400 || binary.BigEndian.Uint16(m[4:6]) != 0 {
			t.Fatalf("ICMP header % x", m[:8])
		}
		if refChecksum(m) != 0 {
			t.Fatal("ICMP checksum does not verify")
		}
		if !bytes.Equal(m[8:], pkt[:wantQ]) {
			t.Fatal("quote differs from the original")
		}
		f, err := ParseFlow(dst[:n])
		if err != nil || f.Proto != ProtoICMP || f.SrcPort != 3 || f.DstPort != 4 {
			t.Fatalf("flow of the error: %+v %v", f, err)
		}
	}
}

func TestICMPv4FragNeededRefusals(t *testing.T) {
	gw := netip.MustParseAddr("198.18.0.254")
	dst := make([]byte, 600)
	base := func(src, dstA string, proto uint8, payload []byte) []byte {
		return ipv4Packet(src, dstA, proto, nil, payload)
	}
	frag := base("198.18.0.1", "198.19.0.2", ProtoUDP, ports(1, 2, 8))
	binary.BigEndian.PutUint16(frag[6:8], 10)
	for _, tc := range []struct {
		name string
		pkt  []byte
		err  error
	}{
		{"icmp error", base("198.18.0.1", "198.19.0.2", ProtoICMP, []byte{11, 0, 0, 0, 0, 0, 0, 0}), ErrNoICMP},
		{"icmp dest unreach", base("198.18.0.1", "198.19.0.2", ProtoICMP, []byte{3, 1, 0, 0, 0, 0, 0, 0}), ErrNoICMP},
		{"non-first fragment", frag, ErrNoICMP},
		{"multicast source", base("224.0.0.1", "198.19.0.2", ProtoUDP, ports(1, 2, 8)), ErrNoICMP},
		{"zero source", base("0.0.0.0", "198.19.0.2", ProtoUDP, ports(1, 2, 8)), ErrNoICMP},
		{"loopback source", base("127.0.0.1", "198.19.0.2", ProtoUDP, ports(1, 2, 8)), ErrNoICMP},
		{"multicast destination", base("198.18.0.1", "239.1.1.1", ProtoUDP, ports(1, 2, 8)), ErrNoICMP},
		{"broadcast destination", base("198.18.0.1", "255.255.255.255", ProtoUDP, ports(1, 2, 8)), ErrNoICMP},
		{"truncated", base("198.18.0.1", "198.19.0.2", ProtoUDP, ports(1, 2, 8))[:25], ErrTruncated},
		{"ipv6", ipv6Packet("2001:db8::1", "2001:db8::2", ProtoUDP, nil), ErrVersion},
	} {
		if _, err := ICMPv4FragNeeded(dst, gw, tc.pkt, 1400); err != tc.err {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.err)
		}
	}
	echo := base("198.18.0.1", "198.19.0.2", ProtoICMP, []byte{8, 0, 0, 0, 0, 0, 0, 0})
	if _, err := ICMPv4FragNeeded(dst, gw, echo, 1400); err != nil {
		t.Errorf("echo request refused: %v", err)
	}
	if _, err := ICMPv4FragNeeded(dst, gw, echo, 67); err != ErrMTU {
		t.Errorf("mtu 67: %v", err)
	}
	if _, err := ICMPv4FragNeeded(dst, netip.MustParseAddr("2001:db8::1"), echo, 1400); err != ErrFamily {
		t.Errorf("IPv6 source: %v", err)
	}
	if _, err := ICMPv4FragNeeded(dst[:28+20+7], gw, echo, 1400); err != ErrShortBuffer {
		t.Errorf("short buffer: %v", err)
	}
	// A buffer that fits the header and 8 bytes but not all: quote shortened.
	big := base("198.18.0.1", "198.19.0.2", ProtoUDP, ports(1, 2, 300))
	if n, err := ICMPv4FragNeeded(dst[:100], gw, big, 1400); err != nil || n != 100 {
		t.Errorf("small buffer: %d %v", n, err)
	}
}

func TestICMPv6PacketTooBig(t *testing.T) {
	gw := netip.MustParseAddr("2001:db8::fe")
	osrc := netip.MustParseAddr("2001:db8::1")
	for _, plen := range []int{8, 100, 1192, 1193, 1400} {
		pkt := ipv6Packet("2001:db8::1", "2001:db8:1::2", ProtoUDP, ports(1, 2, plen))
		dst := make([]byte, 1500)
		n, err := PacketTooBig(dst, gw, pkt, 1300)
		if err != nil {
			t.Fatalf("plen %d: %v", plen, err)
		}
		wantQ := min(len(pkt), 1280-48)
		if n != 48+wantQ {
			t.Fatalf("plen %d: length %d, want %d", plen, n, 48+wantQ)
		}
		h, err := ParseIPv6Header(dst[:n])
		if err != nil || h.Src != gw || h.Dst != osrc || h.NextHeader != ProtoICMPv6 || int(h.PayloadLen) != n-40 || h.HopLimit == 0 {
			t.Fatalf("outer header %+v %v", h, err)
		}
		m := dst[40:n]
		if m[0] != 2 || m[1] != 0 || binary.BigEndian.Uint32(m[4:8]) != 1300 {
			t.Fatalf("ICMPv6 header % x", m[:8])
		}
		s, d := gw.As16(), osrc.As16()
		ph := cat(s[:], d[:], []byte{0, 0, byte(len(m) >> 8), byte(len(m)), 0, 0, 0, ProtoICMPv6})
		if refChecksum(ph, m) != 0 {
			t.Fatal("ICMPv6 checksum does not verify")
		}
		if !bytes.Equal(m[8:], pkt[:wantQ]) {
			t.Fatal("quote differs")
		}
	}
	// PTB goes to multicast destinations too, never to ICMPv6 errors.
	mc := ipv6Packet("2001:db8::1", "ff0e::1", ProtoUDP, ports(1, 2, 8))
	if _, err := ICMPv6PacketTooBig(make([]byte, 1280), gw, mc, 1280); err != nil {
		t.Errorf("multicast destination: %v", err)
	}
	for _, tc := range []struct {
		name string
		pkt  []byte
	}{
		{"icmpv6 error", ipv6Packet("2001:db8::1", "2001:db8::2", ProtoICMPv6, []byte{1, 4, 0, 0, 0, 0, 0, 0})},
		{"icmpv6 error behind extensions", ipv6Packet("2001:db8::1", "2001:db8::2", ProtoHopByHop, cat(ext(ProtoICMPv6, 0), []byte{3, 0, 0, 0}))},
		{"unspecified source", ipv6Packet("::", "2001:db8::2", ProtoUDP, ports(1, 2, 8))},
		{"multicast source", ipv6Packet("ff02::1", "2001:db8::2", ProtoUDP, ports(1, 2, 8))},
	} {
		if _, err := ICMPv6PacketTooBig(make([]byte, 1280), gw, tc.pkt, 1280); err != ErrNoICMP {
			t.Errorf("%s: %v, want ErrNoICMP", tc.name, err)
		}
	}
	echo := ipv6Packet("2001:db8::1", "2001:db8::2", ProtoICMPv6, []byte{128, 0, 0, 0, 0, 0, 0, 0})
	if _, err := ICMPv6PacketTooBig(make([]byte, 1280), gw, echo, 1280); err != nil {
		t.Errorf("echo request: %v", err)
	}
	if _, err := ICMPv6PacketTooBig(make([]byte, 1280), netip.MustParseAddr("198.18.0.1"), echo, 1280); err != ErrFamily {
		t.Errorf("IPv4 source: %v", err)
	}
	if _, err := ICMPv6PacketTooBig(make([]byte, 1280), gw, echo[:47], 1280); err != ErrTruncated {
		t.Errorf("truncated: %v", err)
	}
	if _, err := PacketTooBig(nil, gw, []byte{0x10}, 1280); err != ErrVersion {
		t.Errorf("version 1: %v", err)
	}
}

func TestICMPAllocs(t *testing.T) {
	pkt := ipv6Packet("2001:db8::1", "2001:db8::2", ProtoUDP, ports(1, 2, 1400))
	dst := make([]byte, 1280)
	gw := netip.MustParseAddr("2001:db8::fe")
	if n := testing.AllocsPerRun(50, func() { ICMPv6PacketTooBig(dst, gw, pkt, 1300) }); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}
