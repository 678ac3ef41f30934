package esp

import (
	"crypto/aes"
	"crypto/cipher"
	"fmt"
	"testing"

	"golang.org/x/crypto/chacha20poly1305"
)

// benchSizes are the inner packet sizes every benchmark runs at.
var benchSizes = []int{64, 512, 1400}

// BenchmarkEncapsulate measures Encapsulate (IPv4 in IPv4, raw ESP) for
// every suite; the inner packet is restored before each call since
// encryption happens in place.
func BenchmarkEncapsulate(b *testing.B) {
	for _, name := range suiteNames {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("%s/%d", name, n), func(b *testing.B) {
				e := &Encapsulator{SPI: 1, Transform: newSuite(b, name), Outer: outers()[0].o}
				in := innerV4(n, 0, true)
				buf, off := place(in, MaxTrailer)
				b.SetBytes(int64(n))
				b.ReportAllocs()
				seq := uint64(0)
				for b.Loop() {
					seq++
					copy(buf[off:], in)
					if _, err := e.Encapsulate(buf, off, n, seq); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkDecapsulate measures Decapsulate of one sealed packet, copied
// back before each call, with the window off (so the same sequence number
// passes) but still consulted.
func BenchmarkDecapsulate(b *testing.B) {
	for _, name := range suiteNames {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("%s/%d", name, n), func(b *testing.B) {
				tr := newSuite(b, name)
				pkt := sealedPacket(b, tr, outers()[0].o, 4, n, 1)
				work := make([]byte, len(pkt))
				d := &Decapsulator{Transform: tr, Replay: NewReplayWindow(0, false), ECN: true}
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					copy(work, pkt)
					if _, _, err := d.Decapsulate(work, 0); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkRoundTrip measures Encapsulate then Decapsulate with a 1024
// replay window and rising sequence numbers: the ESP cost of one packet at
// both ends, to compare with BenchmarkRawAEAD's seal and open.
func BenchmarkRoundTrip(b *testing.B) {
	for _, name := range suiteNames {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("%s/%d", name, n), func(b *testing.B) {
				tr := newSuite(b, name)
				e := &Encapsulator{SPI: 1, Transform: tr, Outer: outers()[0].o}
				d := &Decapsulator{Transform: tr, Replay: NewReplayWindow(1024, false), ECN: true}
				in := innerV4(n, 0, true)
				buf, off := place(in, MaxTrailer)
				b.SetBytes(int64(n))
				b.ReportAllocs()
				seq := uint64(0)
				for b.Loop() {
					seq++
					copy(buf[off:], in)
					p, err := e.Encapsulate(buf, off, n, seq)
					if err != nil {
						b.Fatal(err)
					}
					if _, _, err := d.Decapsulate(buf[p.ESP:p.End], 0); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkRawAEAD seals and opens n bytes in place with the bare AEAD
// (12-byte nonce, 8-byte AAD, 16-byte tag): the floor that the ESP round
// trip of the same suite and size is measured against.
func BenchmarkRawAEAD(b *testing.B) {
	type mk func() cipher.AEAD
	gcm := func(bits int) mk {
		return func() cipher.AEAD {
			blk, err := aes.NewCipher(make([]byte, bits/8))
			if err != nil {
				b.Fatal(err)
			}
			a, err := cipher.NewGCM(blk)
			if err != nil {
				b.Fatal(err)
			}
			return a
		}
	}
	for _, c := range []struct {
		name string
		new  mk
	}{
		{"aes128gcm16", gcm(128)}, {"aes192gcm16", gcm(192)}, {"aes256gcm16", gcm(256)},
		{"chacha20poly1305", func() cipher.AEAD {
			a, err := chacha20poly1305.New(make([]byte, 32))
			if err != nil {
				b.Fatal(err)
			}
			return a
		}},
	} {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("%s/%d", c.name, n), func(b *testing.B) {
				a := c.new()
				nonce := make([]byte, a.NonceSize())
				aad := make([]byte, 8)
				buf := make([]byte, n+a.Overhead())
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					nonce[11]++
					ct := a.Seal(buf[:0], nonce, buf[:n], aad)
					if _, err := a.Open(ct[:0], nonce, ct, aad); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
