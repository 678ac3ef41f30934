package packet

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
)

func TestChecksumKnownHeader(t *testing.T) {
	// A well-known IPv4 header whose checksum is 0xb861.
	h := []byte{0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
		0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7}
	if c := Checksum(h, 0); c != 0xb861 {
		t.Fatalf("checksum %#04x, want 0xb861", c)
	}
	binary.BigEndian.PutUint16(h[10:], 0xb861)
	if c := Checksum(h, 0); c != 0 {
		t.Fatalf("checksum over a valid header %#04x, want 0", c)
	}
}

func TestChecksumMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 2000)
	for i := range 3000 {
		n := r.IntN(len(buf))
		b := buf[:n]
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		if i%7 == 0 { // stress carries
			for j := range b {
				b[j] = 0xff
			}
		}
		if got, want := Checksum(b, 0), refChecksum(b); got != want {
			t.Fatalf("len %d: checksum %#04x, want %#04x", n, got, want)
		}
		// Split at an even point: partial sums chain.
		k := r.IntN(n+1) &^ 1
		if got, want := Checksum(b[k:], Sum(b[:k], 0)), refChecksum(b); got != want {
			t.Fatalf("len %d split %d: %#04x, want %#04x", n, k, got, want)
		}
	}
}

// TestSumLengths checks Sum at every length up to 300, at even and odd
// offsets (unaligned loads), over random and all-ones data (where the
// carries pile up), from random 32-bit initial sums, and over 64 KiB of
// ones, against the word-by-word sum.
func TestSumLengths(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 301)
	var init [4]byte
	for _, fill := range []string{"random", "ones"} {
		for i := range buf {
			buf[i] = 0xff
			if fill == "random" {
				buf[i] = byte(r.Uint32())
			}
		}
		for off := range 2 {
			for n := 0; off+n <= len(buf); n++ {
				b := buf[off : off+n]
				v := r.Uint32()
				binary.BigEndian.PutUint32(init[:], v)
				if got, want := Checksum(b, v), refChecksum(init[:], b); got != want {
					t.Fatalf("%s data, offset %d, %d bytes, initial %#x: %#04x, want %#04x", fill, off, n, v, got, want)
				}
			}
		}
	}
	big := make([]byte, 65536)
	for i := range big {
		big[i] = 0xff
	}
	if got, want := Checksum(big, 0xffff), refChecksum([]byte{0xff, 0xff}, big); got != want {
		t.Errorf("64 KiB of ones: %#04x, want %#04x", got, want)
	}
}

func TestUpdateChecksum(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	b := make([]byte, 20)
	for range 5000 {
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		b[10], b[11] = 0, 0
		binary.BigEndian.PutUint16(b[10:], Checksum(b, 0))
		i := 2 * r.IntN(10)
		if i == 10 {
			continue
		}
		old := binary.BigEndian.Uint16(b[i:])
		nw := uint16(r.Uint32())
		binary.BigEndian.PutUint16(b[i:], nw)
		binary.BigEndian.PutUint16(b[10:], UpdateChecksum16(binary.BigEndian.Uint16(b[10:]), old, nw))
		if Checksum(b, 0) != 0 {
			t.Fatalf("16-bit update left an invalid checksum")
		}
	}
}

func TestPseudoHeaderSum(t *testing.T) {
	src, dst := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
	data := []byte{1, 2, 3, 4, 5}
	ph := make([]byte, 40)
	s16, d16 := src.As16(), dst.As16()
	copy(ph, s16[:])
	copy(ph[16:], d16[:])
	binary.BigEndian.PutUint32(ph[32:], uint32(len(data)))
	ph[39] = ProtoUDP
	if got, want := Checksum(data, PseudoHeaderSum(ProtoUDP, src, dst, len(data))), refChecksum(ph, data); got != want {
		t.Fatalf("IPv6 pseudo-header checksum %#04x, want %#04x", got, want)
	}
	s4, d4 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.19.0.2")
	ph4 := make([]byte, 12)
	a, b := s4.As4(), d4.As4()
	copy(ph4, a[:])
	copy(ph4[4:], b[:])
	ph4[9] = ProtoUDP
	binary.BigEndian.PutUint16(ph4[10:], uint16(len(data)))
	if got, want := Checksum(data, PseudoHeaderSum(ProtoUDP, s4, d4, len(data))), refChecksum(ph4, data); got != want {
		t.Fatalf("IPv4 pseudo-header checksum %#04x, want %#04x", got, want)
	}
}

func BenchmarkChecksum1400(b *testing.B) {
	buf := make([]byte, 1400)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		Checksum(buf, 0)
	}
}
