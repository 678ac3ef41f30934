package testbed

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func parsed(ethertype uint16, pkt []byte) Frame {
	f := Frame{EtherType: ethertype, Len: len(pkt), Data: pkt}
	f.parse(pkt)
	return f
}

func TestBuildChecksums(t *testing.T) {
	src, dst := GwATransitV4.Addr(), GwBTransitV4.Addr()
	u, err := BuildUDP(src, dst, 4500, 4500, []byte("hello, esp"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := BuildIP(src, dst, 17, u)
	if err != nil {
		t.Fatal(err)
	}
	if got := fold(sum32(0, p[:20])); got != 0xffff {
		t.Errorf("IPv4 header sums to %#x", got)
	}
	// UDP: pseudo-header + datagram sums to 0xffff.
	s, d := src.As4(), dst.As4()
	sum := sum32(sum32(0, s[:]), d[:]) + 17 + uint32(len(u))
	if got := fold(sum32(sum, u)); got != 0xffff {
		t.Errorf("UDP sums to %#x", got)
	}
	if _, err := BuildIP(src, GwBTransitV6.Addr(), 17, u); err == nil {
		t.Error("mixed families accepted")
	}
}

func TestClassify(t *testing.T) {
	a4, b4 := GwATransitV4.Addr(), GwBTransitV4.Addr()
	a6, b6 := GwATransitV6.Addr(), GwBTransitV6.Addr()
	esp := BuildESP(0x1001, 42, make([]byte, 40))
	mk := func(src, dst netip.Addr, proto uint8, payload []byte) (uint16, []byte) {
		p, err := BuildIP(src, dst, proto, payload)
		if err != nil {
			t.Fatal(err)
		}
		if src.Is4() {
			return EtherTypeIPv4, p
		}
		return EtherTypeIPv6, p
	}
	udp := func(src, dst netip.Addr, sp, dp uint16, pl []byte) []byte {
		u, err := BuildUDP(src, dst, sp, dp, pl)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	cases := []struct {
		name  string
		et    uint16
		pkt   []byte
		class Class
		spi   uint32
	}{
		{"esp4", 0, nil, ClassESP, 0x1001},
		{"esp6", 0, nil, ClassESP, 0x1001},
		{"udp-esp4", 0, nil, ClassESPInUDP, 0x1001},
		{"ike-marker6", 0, nil, ClassIKE, 0},
		{"ike500", 0, nil, ClassIKE, 0},
		{"keepalive4", 0, nil, ClassKeepalive, 0},
		{"tcp4", 0, nil, ClassOther, 0},
		{"ns6", 0, nil, ClassLink, 0},
		{"arp", EtherTypeARP, make([]byte, 28), ClassLink, 0},
		{"garbage4", EtherTypeIPv4, []byte{0x45, 1, 2}, ClassOther, 0},
	}
	cases[0].et, cases[0].pkt = mk(a4, b4, 50, esp)
	cases[1].et, cases[1].pkt = mk(a6, b6, 50, esp)
	cases[2].et, cases[2].pkt = mk(a4, b4, 17, udp(a4, b4, 4500, 4500, esp))
	cases[3].et, cases[3].pkt = mk(a6, b6, 17, udp(a6, b6, 4500, 4500, make([]byte, 40)))
	cases[4].et, cases[4].pkt = mk(a4, b4, 17, udp(a4, b4, 500, 500, make([]byte, 40)))
	cases[5].et, cases[5].pkt = mk(a4, b4, 17, udp(a4, b4, 4500, 4500, []byte{0xff}))
	cases[6].et, cases[6].pkt = mk(a4, b4, 6, make([]byte, 20))
	cases[7].et, cases[7].pkt = mk(a6, b6, 58, []byte{135, 0, 0, 0})
	for _, c := range cases {
		f := parsed(c.et, c.pkt)
		if f.Class != c.class || f.SPI != c.spi {
			t.Errorf("%s: %s, want %s spi %#x", c.name, f.String(), c.class, c.spi)
		}
		if c.class == ClassESP || c.class == ClassESPInUDP {
			if e := f.ESP(); len(e) != len(esp) || binary.BigEndian.Uint32(e[4:]) != 42 {
				t.Errorf("%s: ESP() = %x", c.name, e)
			}
		}
	}
}

func TestFragments(t *testing.T) {
	a, b := GwATransitV4.Addr(), GwBTransitV4.Addr()
	u, _ := BuildUDP(a, b, 4500, 4500, BuildESP(0x2002, 1, make([]byte, 64)))
	first, _ := BuildIP(a, b, 17, u[:32])
	binary.BigEndian.PutUint16(first[4:], 77)     // ID
	binary.BigEndian.PutUint16(first[6:], 0x2000) // MF
	second, _ := BuildIP(a, b, 17, u[32:])
	binary.BigEndian.PutUint16(second[4:], 77)
	binary.BigEndian.PutUint16(second[6:], 4) // offset 32
	stray, _ := BuildIP(a, b, 17, u[32:])
	binary.BigEndian.PutUint16(stray[4:], 78)
	binary.BigEndian.PutUint16(stray[6:], 4)
	fr := []Frame{parsed(EtherTypeIPv4, second), parsed(EtherTypeIPv4, first), parsed(EtherTypeIPv4, stray)}
	classifyFragments(fr)
	if fr[0].Class != ClassESPInUDP || fr[1].Class != ClassESPInUDP || fr[2].Class != ClassOther {
		t.Errorf("fragments: %s / %s / %s", fr[0].String(), fr[1].String(), fr[2].String())
	}
	// IPv6 fragment header, non-first fragment of ESP.
	a6, b6 := GwATransitV6.Addr(), GwBTransitV6.Addr()
	fh := []byte{50, 0, 0, 8 | 1, 0, 0, 0, 9}
	p6, _ := BuildIP(a6, b6, 44, append(fh, make([]byte, 16)...))
	f6 := parsed(EtherTypeIPv6, p6)
	if f6.Class != ClassESP || !f6.Fragment || f6.FirstFragment || f6.FragID != 9 {
		t.Errorf("IPv6 fragment: %s", f6.String())
	}
}

func TestLeaks(t *testing.T) {
	c4, s4 := ClientV4.Addr(), ServerV4.Addr()
	c6, s6 := ClientV6.Addr(), ServerV6.Addr()
	inner, _ := BuildIP(c4, s4, 6, make([]byte, 20))
	innerV6, _ := BuildIP(c6, s6, 6, make([]byte, 20))
	a, b := GwATransitV4.Addr(), GwBTransitV4.Addr()
	wrap := func(payload []byte) Frame {
		p, _ := BuildIP(a, b, 50, BuildESP(1, 1, payload))
		return parsed(EtherTypeIPv4, p)
	}
	cleartext, _ := BuildIP(c4, s4, 17, make([]byte, 20))
	res := &CaptureResult{Frames: []Frame{
		wrap(make([]byte, 100)),                // ciphertext: no leak
		wrap(inner),                            // an inner IPv4 header inside "ESP"
		wrap(innerV6),                          // an inner IPv6 header
		parsed(EtherTypeIPv4, cleartext),       // inner addresses as outer ones
		wrap(append(c4.AsSlice(), 9, 9, 9, 9)), // one IPv4 address alone: no leak
	}}
	leaks := res.Leaks(c4, s4, c6, s6)
	if len(leaks) != 3 || leaks[0].Data[20+8] != 0x45 || leaks[1].Data[20+8] != 0x60 || leaks[2].Proto != 17 {
		t.Errorf("leaks: %d", len(leaks))
		for _, f := range leaks {
			t.Log(f.String())
		}
	}
}

// TestFrameTime reads the kernel's time stamp from a control message and
// falls back to the reader's time without one.
func TestFrameTime(t *testing.T) {
	want := time.Date(2026, 12, 6, 1, 2, 3, 456789012, time.UTC)
	ts := unix.NsecToTimespec(want.UnixNano())
	oob := make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(ts))))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.SOL_SOCKET, unix.SCM_TIMESTAMPNS
	h.SetLen(unix.CmsgLen(int(unsafe.Sizeof(ts))))
	*(*unix.Timespec)(unsafe.Pointer(&oob[unix.CmsgLen(0)])) = ts
	if got := frameTime(oob); !got.Equal(want) {
		t.Errorf("frameTime = %v, want %v", got, want)
	}
	before := time.Now()
	if got := frameTime(nil); got.Before(before) || got.After(time.Now()) {
		t.Errorf("frameTime(nil) = %v, want now", got)
	}
}

// TestEcho finds an echo's identifier and sequence in both families and
// nothing in other frames.
func TestEcho(t *testing.T) {
	echo := func(typ byte, id, seq uint16) []byte {
		b := []byte{typ, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq), 'x'}
		return b
	}
	a4, b4 := netip.MustParseAddr("198.18.1.2"), netip.MustParseAddr("198.18.2.2")
	a6, b6 := netip.MustParseAddr("2001:db8:1::2"), netip.MustParseAddr("2001:db8:2::2")
	for _, c := range []struct {
		src, dst     netip.Addr
		proto        uint8
		payload      []byte
		id, seq      uint16
		reply, found bool
	}{
		{a4, b4, 1, echo(8, 7, 300), 7, 300, false, true},
		{b4, a4, 1, echo(0, 7, 300), 7, 300, true, true},
		{a6, b6, 58, echo(128, 9, 1), 9, 1, false, true},
		{b6, a6, 58, echo(129, 9, 1), 9, 1, true, true},
		{a4, b4, 1, echo(3, 7, 300), 0, 0, false, false},     // unreachable
		{a6, b6, 58, echo(135, 9, 1), 0, 0, false, false},    // neighbour solicitation
		{a4, b4, 17, echo(8, 7, 300), 0, 0, false, false},    // UDP
		{a4, b4, 1, echo(8, 7, 300)[:6], 0, 0, false, false}, // truncated
	} {
		p, err := BuildIP(c.src, c.dst, c.proto, c.payload)
		if err != nil {
			t.Fatal(err)
		}
		f := ParseFrame(p, time.Now(), true)
		id, seq, reply, ok := f.Echo()
		if ok != c.found || id != c.id || seq != c.seq || reply != c.reply {
			t.Errorf("%v->%v proto %d % x: Echo() = %d, %d, %v, %v; want %d, %d, %v, %v",
				c.src, c.dst, c.proto, c.payload, id, seq, reply, ok, c.id, c.seq, c.reply, c.found)
		}
	}
}
