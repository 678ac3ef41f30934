package packet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

func TestIPv4HeaderRoundTrip(t *testing.T) {
	h := IPv4Header{TOS: 0xb9, TotalLen: 1400, ID: 0xbeef, DF: true, FragOffset: 0,
		TTL: 17, Protocol: ProtoESP,
		Src: netip.MustParseAddr("198.18.1.2"), Dst: netip.MustParseAddr("198.19.3.4")}
	b := make([]byte, 1400)
	n, err := PutIPv4Header(b, h)
	if err != nil || n != 20 {
		t.Fatalf("PutIPv4Header: %d %v", n, err)
	}
	if refChecksum(b[:20]) != 0 {
		t.Fatal("header checksum does not verify")
	}
	want := []byte{0x45, 0xb9, 0x05, 0x78, 0xbe, 0xef, 0x40, 0x00, 17, 50}
	if !bytes.Equal(b[:10], want) {
		t.Fatalf("header % x, want % x", b[:10], want)
	}
	got, err := ParseIPv4Header(b)
	if err != nil {
		t.Fatal(err)
	}
	h.HeaderLen, h.Checksum = 20, binary.BigEndian.Uint16(b[10:])
	if got != h {
		t.Fatalf("parsed %+v, want %+v", got, h)
	}
	h.DF, h.MF, h.FragOffset = false, true, 1480
	PutIPv4Header(b, h)
	if binary.BigEndian.Uint16(b[6:8]) != 0x2000|185 {
		t.Fatalf("flags/offset %#04x", binary.BigEndian.Uint16(b[6:8]))
	}
	if got, _ := ParseIPv4Header(b); !got.MF || got.DF || got.FragOffset != 1480 {
		t.Fatalf("parsed fragment fields %+v", got)
	}
}

func TestIPv4HeaderErrors(t *testing.T) {
	a4, a6 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:db8::1")
	if _, err := PutIPv4Header(make([]byte, 19), IPv4Header{Src: a4, Dst: a4}); err != ErrShortBuffer {
		t.Errorf("short buffer: %v", err)
	}
	if _, err := PutIPv4Header(make([]byte, 20), IPv4Header{Src: a4, Dst: a6}); err != ErrFamily {
		t.Errorf("family: %v", err)
	}
	good := ipv4Packet("198.18.0.1", "198.18.0.2", ProtoUDP, nil, ports(1, 2, 8))
	mod := func(f func(p []byte)) []byte {
		p := append([]byte(nil), good...)
		f(p)
		return p
	}
	for _, tc := range []struct {
		name string
		pkt  []byte
		err  error
	}{
		{"short", good[:19], ErrTruncated},
		{"version", mod(func(p []byte) { p[0] = 0x65 }), ErrVersion},
		{"ihl", mod(func(p []byte) { p[0] = 0x43 }), ErrHeaderLength},
		{"ihl past buffer", mod(func(p []byte) { p[0] = 0x4f }), ErrTruncated},
		{"total below ihl", mod(func(p []byte) { p[3] = 10 }), ErrTotalLength},
		{"total past buffer", mod(func(p []byte) { p[3] = 200 }), ErrTruncated},
		{"checksum", mod(func(p []byte) { p[8]-- }), ErrChecksum},
	} {
		if _, err := ParseIPv4Header(tc.pkt); !errors.Is(err, tc.err) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.err)
		}
	}
}

func TestIPv6HeaderRoundTrip(t *testing.T) {
	h := IPv6Header{TrafficClass: 0xb9, FlowLabel: 0xabcde, PayloadLen: 8, NextHeader: ProtoUDP, HopLimit: 3,
		Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8::2")}
	b := make([]byte, 48)
	if n, err := PutIPv6Header(b, h); n != 40 || err != nil {
		t.Fatalf("PutIPv6Header: %d %v", n, err)
	}
	if !bytes.Equal(b[:8], []byte{0x6b, 0x9a, 0xbc, 0xde, 0, 8, 17, 3}) {
		t.Fatalf("header % x", b[:8])
	}
	got, err := ParseIPv6Header(b)
	if err != nil || got != h {
		t.Fatalf("parsed %+v %v, want %+v", got, err, h)
	}
	if _, err := ParseIPv6Header(b[:47]); err != ErrTruncated {
		t.Errorf("payload past buffer: %v", err)
	}
	if _, err := PutIPv6Header(b, IPv6Header{Src: netip.MustParseAddr("198.18.0.1"), Dst: h.Dst}); err != ErrFamily {
		t.Errorf("family: %v", err)
	}
}

func TestUDPHeader(t *testing.T) {
	for _, fam := range []struct{ src, dst string }{{"198.18.0.1", "198.19.0.1"}, {"2001:db8::1", "2001:db8::2"}} {
		src, dst := netip.MustParseAddr(fam.src), netip.MustParseAddr(fam.dst)
		for _, plen := range []int{0, 1, 7, 100, 1401} {
			b := make([]byte, 8+plen+3)
			for i := range plen {
				b[8+i] = byte(i*7 + 1)
			}
			if n, err := PutUDPHeader(b, 4500, 4501, plen); n != 8 || err != nil {
				t.Fatalf("PutUDPHeader: %d %v", n, err)
			}
			if binary.BigEndian.Uint16(b[4:6]) != uint16(8+plen) || binary.BigEndian.Uint16(b[6:8]) != 0 {
				t.Fatalf("length/checksum fields % x", b[4:8])
			}
			if UDPChecksumValid(b, src, dst) != src.Is4() {
				t.Fatalf("zero checksum valid=%v for %v", !src.Is4(), src)
			}
			if err := SetUDPChecksum(b, src, dst); err != nil {
				t.Fatal(err)
			}
			// Independent check: pseudo-header built by hand.
			var ph []byte
			if src.Is4() {
				s, d := src.As4(), dst.As4()
				ph = cat(s[:], d[:], []byte{0, ProtoUDP, byte((8 + plen) >> 8), byte(8 + plen)})
			} else {
				s, d := src.As16(), dst.As16()
				ph = cat(s[:], d[:], []byte{0, 0, byte((8 + plen) >> 8), byte(8 + plen), 0, 0, 0, ProtoUDP})
			}
			if c := refChecksum(ph, b[:8+plen]); c != 0 && !(c == 0xffff && binary.BigEndian.Uint16(b[6:8]) == 0xffff) {
				t.Fatalf("%v len %d: checksum does not verify (%#04x)", src, plen, c)
			}
			if !UDPChecksumValid(b, src, dst) {
				t.Fatal("UDPChecksumValid rejects a good checksum")
			}
			b[9]++
			if plen > 1 && UDPChecksumValid(b, src, dst) {
				t.Fatal("UDPChecksumValid accepts a corrupted datagram")
			}
			b[9]--
			h, payload, err := ParseUDPHeader(b)
			if err != nil || h.SrcPort != 4500 || h.DstPort != 4501 || len(payload) != plen {
				t.Fatalf("ParseUDPHeader: %+v %d %v", h, len(payload), err)
			}
		}
	}
	if _, _, err := ParseUDPHeader([]byte{0, 1, 0, 2, 0, 7, 0, 0}); err != ErrTotalLength {
		t.Errorf("length 7: %v", err)
	}
	if _, _, err := ParseUDPHeader([]byte{0, 1, 0, 2, 0, 9, 0, 0}); err != ErrTruncated {
		t.Errorf("length past buffer: %v", err)
	}
	if _, err := PutUDPHeader(make([]byte, 8), 1, 2, 65528); err != ErrTotalLength {
		t.Errorf("oversized payload: %v", err)
	}
}

func TestTOS(t *testing.T) {
	p4 := ipv4Packet("198.18.0.1", "198.18.0.2", ProtoUDP, nil, ports(1, 2, 8))
	p6 := ipv6Packet("2001:db8::1", "2001:db8::2", ProtoUDP, ports(1, 2, 8))
	binary.BigEndian.PutUint32(p6[0:4], 0x60012345) // flow label must survive
	for _, p := range [][]byte{p4, p6} {
		for _, tos := range []uint8{0, 0xff, 0xb8, 0x01, 0x02, 0x03, 0x2e << 2} {
			if !SetTOS(p, tos) {
				t.Fatal("SetTOS failed")
			}
			if got, ok := TOS(p); !ok || got != tos {
				t.Fatalf("TOS %#x, want %#x", got, tos)
			}
			if p[0]>>4 == 4 && refChecksum(p[:20]) != 0 {
				t.Fatalf("IPv4 checksum invalid after SetTOS(%#x)", tos)
			}
			if p[0]>>4 == 6 && binary.BigEndian.Uint32(p[0:4])&0xf00fffff != 0x60012345 {
				t.Fatalf("IPv6 version/flow label clobbered: %#08x", binary.BigEndian.Uint32(p[0:4]))
			}
		}
		SetTOS(p, 46<<2)
		SetECN(p, ECNECT0)
		if e, _ := ECN(p); e != ECNECT0 {
			t.Fatalf("ECN %d", e)
		}
		if tos, _ := TOS(p); tos != 46<<2|ECNECT0 {
			t.Fatalf("TOS %#x after SetECN(ECT0)", tos)
		}
		SetECN(p, ECNCE)
		if tos, _ := TOS(p); tos != 46<<2|3 {
			t.Fatalf("TOS %#x after SetECN(CE)", tos)
		}
		if p[0]>>4 == 4 && refChecksum(p[:20]) != 0 {
			t.Fatal("IPv4 checksum invalid")
		}
	}
	for _, bad := range [][]byte{nil, {0x45}, p6[:39], {0x70, 0, 0, 0}} {
		if _, ok := TOS(bad); ok {
			t.Errorf("TOS(% x) ok", bad)
		}
		if SetTOS(bad, 1) || SetECN(bad, 1) {
			t.Errorf("Set on % x ok", bad)
		}
	}
}

// TestIPv4LengthsCallers pins the header checks FragmentIPv4 and
// ICMPv4FragNeeded share through ipv4Lengths: the same error, in the same
// order, from both, for each malformed header. Each case edits its own copy
// of a good 1508-byte UDP packet.
func TestIPv4LengthsCallers(t *testing.T) {
	gw := netip.MustParseAddr("198.18.0.254")
	good := ipv4Packet("198.18.0.1", "198.19.0.2", ProtoUDP, nil, ports(1, 2, 1480))
	cases := []struct {
		name string
		edit func(p []byte) []byte
		err  error
	}{
		{"empty", func([]byte) []byte { return nil }, ErrTruncated},
		{"short", func(p []byte) []byte { return p[:19] }, ErrTruncated},
		{"version", func(p []byte) []byte { p[0] = 0x65; return p }, ErrVersion},
		{"short and version 6", func([]byte) []byte { return []byte{0x60, 0, 0, 0} }, ErrTruncated},
		{"ihl 4", func(p []byte) []byte { p[0] = 0x44; return p }, ErrHeaderLength},
		{"total below ihl", func(p []byte) []byte { binary.BigEndian.PutUint16(p[2:4], 19); return p }, ErrTotalLength},
		{"ihl past total and buffer", func(p []byte) []byte { p[0] = 0x4f; binary.BigEndian.PutUint16(p[2:4], 40); return p[:40] }, ErrTotalLength},
		{"total past buffer", func(p []byte) []byte { return p[:len(p)-1] }, ErrTruncated},
		{"good", func(p []byte) []byte { return p }, nil},
	}
	for _, tc := range cases {
		pkt := tc.edit(append([]byte(nil), good...))
		hl, tl, err := ipv4Lengths(pkt)
		if err != tc.err || err == nil && (hl != 20 || tl != len(good)) {
			t.Errorf("%s: ipv4Lengths: %d, %d, %v, want 20, %d, %v", tc.name, hl, tl, err, len(good), tc.err)
		}
		frags := [][]byte{make([]byte, 1500), make([]byte, 1500), make([]byte, 1500), make([]byte, 1500)}
		if _, err := FragmentIPv4(frags, pkt, 576); err != tc.err {
			t.Errorf("%s: FragmentIPv4: %v, want %v", tc.name, err, tc.err)
		}
		if _, err := ICMPv4FragNeeded(make([]byte, 600), gw, pkt, 1400); err != tc.err {
			t.Errorf("%s: ICMPv4FragNeeded: %v, want %v", tc.name, err, tc.err)
		}
	}
}
