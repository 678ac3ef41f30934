package packet

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

func TestParseFlow(t *testing.T) {
	a4, b4 := "198.18.0.1", "198.19.0.2"
	a6, b6 := "2001:db8::1", "2001:db8:1::2"
	opt := []byte{0x94, 4, 0, 0, 1, 1, 1, 0} // Router Alert, NOPs, EOL
	frag := func(p []byte, v uint16) []byte {
		binary.BigEndian.PutUint16(p[6:8], v)
		return p
	}
	withLen := func(p []byte, tl int) []byte {
		binary.BigEndian.PutUint16(p[2:4], uint16(tl))
		return p
	}
	withPL := func(p []byte, pl int) []byte {
		binary.BigEndian.PutUint16(p[4:6], uint16(pl))
		return p
	}
	f4 := func(proto uint8, sp, dp uint16) Flow {
		return Flow{netip.MustParseAddr(a4), netip.MustParseAddr(b4), proto, sp, dp}
	}
	f6 := func(proto uint8, sp, dp uint16) Flow {
		return Flow{netip.MustParseAddr(a6), netip.MustParseAddr(b6), proto, sp, dp}
	}
	tests := []struct {
		name string
		pkt  []byte
		want Flow
		err  error
	}{
		{"v4 tcp", ipv4Packet(a4, b4, ProtoTCP, nil, ports(1234, 80, 20)), f4(ProtoTCP, 1234, 80), nil},
		{"v4 udp", ipv4Packet(a4, b4, ProtoUDP, nil, ports(53, 5353, 8)), f4(ProtoUDP, 53, 5353), nil},
		{"v4 sctp", ipv4Packet(a4, b4, ProtoSCTP, nil, ports(9, 10, 12)), f4(ProtoSCTP, 9, 10), nil},
		{"v4 udplite", ipv4Packet(a4, b4, ProtoUDPLite, nil, ports(11, 12, 8)), f4(ProtoUDPLite, 11, 12), nil},
		{"v4 options", ipv4Packet(a4, b4, ProtoUDP, opt, ports(1, 2, 8)), f4(ProtoUDP, 1, 2), nil},
		{"v4 icmp", ipv4Packet(a4, b4, ProtoICMP, nil, []byte{3, 4, 0, 0, 0, 0, 5, 0}), f4(ProtoICMP, 3, 4), nil},
		{"v4 gre no ports", ipv4Packet(a4, b4, 47, nil, []byte{0, 0}), f4(47, 0, 0), nil},
		{"v4 first fragment", frag(ipv4Packet(a4, b4, ProtoTCP, nil, ports(5, 6, 24)), IPv4MoreFragments), f4(ProtoTCP, 5, 6), nil},
		{"v4 later fragment", frag(ipv4Packet(a4, b4, ProtoTCP, nil, ports(5, 6, 24)), 3), f4(ProtoTCP, 0, 0), nil},
		{"v4 later fragment short", frag(ipv4Packet(a4, b4, ProtoTCP, nil, []byte{1}), IPv4MoreFragments|1), f4(ProtoTCP, 0, 0), nil},
		{"v4 trailing bytes ignored", append(ipv4Packet(a4, b4, ProtoUDP, nil, ports(7, 8, 8)), 9, 9, 9), f4(ProtoUDP, 7, 8), nil},
		{"v4 ports truncated", ipv4Packet(a4, b4, ProtoTCP, nil, []byte{1, 2, 3}), Flow{}, ErrTruncated},
		{"v4 ports past total length", withLen(ipv4Packet(a4, b4, ProtoTCP, nil, ports(1, 2, 20)), 22), Flow{}, ErrTruncated},
		{"v4 short header", ipv4Packet(a4, b4, ProtoTCP, nil, nil)[:19], Flow{}, ErrTruncated},
		{"v4 ihl 4", func() []byte { p := ipv4Packet(a4, b4, ProtoTCP, nil, ports(1, 2, 20)); p[0] = 0x44; return p }(), Flow{}, ErrHeaderLength},
		{"v4 ihl past total", func() []byte { p := ipv4Packet(a4, b4, ProtoTCP, nil, ports(1, 2, 20)); p[0] = 0x4f; return p }(), Flow{}, ErrTotalLength},
		{"v4 total past packet", withLen(ipv4Packet(a4, b4, ProtoUDP, nil, ports(1, 2, 8)), 100), Flow{}, ErrTruncated},
		{"v4 total below header", withLen(ipv4Packet(a4, b4, ProtoUDP, nil, ports(1, 2, 8)), 19), Flow{}, ErrTotalLength},
		{"v6 tcp", ipv6Packet(a6, b6, ProtoTCP, ports(443, 5000, 20)), f6(ProtoTCP, 443, 5000), nil},
		{"v6 icmpv6", ipv6Packet(a6, b6, ProtoICMPv6, []byte{128, 0, 0, 0}), f6(ProtoICMPv6, 128, 0), nil},
		{"v6 all extensions", ipv6Packet(a6, b6, ProtoHopByHop, cat(ext(ProtoRouting, 0), ext(ProtoDstOpts, 2),
			fragHdr(ProtoDstOpts, 0, true), ext(ProtoUDP, 1), ports(4500, 4501, 8))), f6(ProtoUDP, 4500, 4501), nil},
		{"v6 later fragment", ipv6Packet(a6, b6, ProtoFragment, cat(fragHdr(ProtoTCP, 1480, false), []byte{1, 2})), f6(ProtoTCP, 0, 0), nil},
		{"v6 no next header", ipv6Packet(a6, b6, ProtoDstOpts, ext(ProtoNoNext, 0)), f6(ProtoNoNext, 0, 0), nil},
		{"v6 esp", ipv6Packet(a6, b6, ProtoESP, []byte{1, 2, 3, 4, 5, 6, 7, 8}), f6(ProtoESP, 0, 0), nil},
		{"v6 trailing ignored", append(ipv6Packet(a6, b6, ProtoUDP, ports(1, 2, 8)), 1, 2), f6(ProtoUDP, 1, 2), nil},
		{"v6 short", ipv6Packet(a6, b6, ProtoUDP, nil)[:39], Flow{}, ErrTruncated},
		{"v6 payload past packet", withPL(ipv6Packet(a6, b6, ProtoUDP, ports(1, 2, 8)), 9), Flow{}, ErrTruncated},
		{"v6 extension truncated", ipv6Packet(a6, b6, ProtoHopByHop, ext(ProtoUDP, 1)[:12]), Flow{}, ErrExtension},
		{"v6 extension length byte missing", ipv6Packet(a6, b6, ProtoRouting, []byte{17}), Flow{}, ErrExtension},
		{"v6 fragment header truncated", ipv6Packet(a6, b6, ProtoFragment, []byte{17, 0, 0, 0}), Flow{}, ErrExtension},
		{"v6 ports cut by payload length", withPL(ipv6Packet(a6, b6, ProtoUDP, ports(1, 2, 8)), 3), Flow{}, ErrTruncated},
		{"empty", nil, Flow{}, ErrTruncated},
		{"version 5", []byte{0x50, 0, 0, 0}, Flow{}, ErrVersion},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseFlow(tc.pkt)
			if !errors.Is(err, tc.err) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if err == nil && got != tc.want {
				t.Fatalf("flow %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseFlowAllocs(t *testing.T) {
	p := ipv6Packet("2001:db8::1", "2001:db8::2", ProtoHopByHop, cat(ext(ProtoTCP, 0), ports(1, 2, 20)))
	if n := testing.AllocsPerRun(100, func() { ParseFlow(p) }); n != 0 {
		t.Fatalf("ParseFlow allocates %v times", n)
	}
}

func FuzzParseFlow(f *testing.F) {
	f.Add(ipv4Packet("198.18.0.1", "198.18.0.2", ProtoTCP, nil, ports(1, 2, 20)))
	f.Add(ipv4Packet("198.18.0.1", "198.18.0.2", ProtoICMP, []byte{1, 1, 1, 0}, []byte{8, 0, 0, 0}))
	f.Add(ipv6Packet("2001:db8::1", "2001:db8::2", ProtoHopByHop, cat(ext(ProtoFragment, 0), fragHdr(ProtoUDP, 0, true), ports(1, 2, 8))))
	f.Add(ipv6Packet("2001:db8::1", "2001:db8::2", ProtoFragment, fragHdr(ProtoSCTP, 8, false)))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		fl, err := ParseFlow(pkt)
		if err != nil {
			return
		}
		switch pkt[0] >> 4 {
		case 4:
			if !fl.Src.Is4() || !fl.Dst.Is4() || fl.Proto != pkt[9] {
				t.Fatalf("inconsistent IPv4 flow %+v", fl)
			}
		case 6:
			if !fl.Src.Is6() || !fl.Dst.Is6() {
				t.Fatalf("inconsistent IPv6 flow %+v", fl)
			}
		default:
			t.Fatalf("accepted version %d", pkt[0]>>4)
		}
		if (fl.Proto == ProtoICMP || fl.Proto == ProtoICMPv6) && (fl.SrcPort > 255 || fl.DstPort > 255) {
			t.Fatalf("ICMP type/code out of range: %+v", fl)
		}
		// Bytes past the IP length field never change the result.
		ext := append(append([]byte(nil), pkt...), 0xde, 0xad)
		fl2, err := ParseFlow(ext)
		if err != nil || fl2 != fl {
			t.Fatalf("trailing bytes changed the flow: %+v %v vs %+v", fl2, err, fl)
		}
	})
}
