package tun

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// refChecksum is the Internet checksum's sum, word by word (RFC 1071).
func refChecksum(b []byte, initial uint16) uint16 {
	s := uint32(initial)
	for len(b) >= 2 {
		s += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

// TestChecksum compares checksum with the word-by-word sum for every
// length up to 300 and odd offsets, random and all-ones data (where the
// carries pile up), and random initial values.
func TestChecksum(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 301)
	for _, fill := range []string{"random", "ones"} {
		for i := range buf {
			buf[i] = 0xff
			if fill == "random" {
				buf[i] = byte(r.Uint32())
			}
		}
		for off := range 2 {
			for n := 0; off+n <= len(buf); n++ {
				init := uint16(r.Uint32())
				if got, want := checksum(buf[off:off+n], init), refChecksum(buf[off:off+n], init); got != want && !(got == 0xffff && want == 0 || got == 0 && want == 0xffff) {
					t.Fatalf("%s data, offset %d, %d bytes, initial %#x: %#x, want %#x", fill, off, n, init, got, want)
				}
			}
		}
	}
	// 64 KiB of 0xff: the 64-bit sums carry on every word.
	big := make([]byte, 65536)
	for i := range big {
		big[i] = 0xff
	}
	if got, want := checksum(big, 0xffff), refChecksum(big, 0xffff); got != want {
		t.Errorf("64 KiB of ones: %#x, want %#x", got, want)
	}
}

func BenchmarkChecksum(b *testing.B) {
	buf := make([]byte, 1400)
	for i := range buf {
		buf[i] = byte(i)
	}
	b.SetBytes(int64(len(buf)))
	for range b.N {
		checksum(buf, 0)
	}
}
