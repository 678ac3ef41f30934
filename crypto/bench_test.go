package crypto

import (
	"crypto/aes"
	"crypto/cipher"
	"strconv"
	"testing"

	"golang.org/x/crypto/chacha20poly1305"
)

// benchSuites are the suites benchmarked: every family and key size, and
// the ESN variants whose code path differs.
var benchSuites = []string{
	"aes128gcm16", "aes192gcm16", "aes256gcm16", "aes128gcm12", "aes256gcm12", "aes128gcm16-esn",
	"chacha20poly1305", "chacha20poly1305-esn",
	"aes128gmac", "aes256gmac", "aes128gmac-esn",
	"aes128-sha1", "aes128-sha256", "aes192-sha256", "aes256-sha256", "aes256-sha384", "aes256-sha512", "aes128-sha256-esn",
	"null-sha1", "null-sha256",
}

// benchSizes are inner packet sizes; SetBytes counts these bytes, and the
// plaintext is padded up to the transform's block with the 2-byte trailer,
// as package esp does.
var benchSizes = []int{64, 512, 1400}

func padded(n, block int) int {
	n += 2
	return (n + block - 1) / block * block
}

func benchTransform(b *testing.B, name string) Transform {
	s, err := ParseSuite(name)
	if err != nil {
		b.Fatal(err)
	}
	tr, _, _ := newRandom(b, s)
	return tr
}

// BenchmarkSeal measures Transform.Seal for every suite and size.
func BenchmarkSeal(b *testing.B) {
	for _, name := range benchSuites {
		for _, n := range benchSizes {
			b.Run(name+"/"+strconv.Itoa(n), func(b *testing.B) {
				tr := benchTransform(b, name)
				pkt := layout(tr, 0x100, 1, make([]byte, padded(n, tr.BlockSize())))
				b.SetBytes(int64(n))
				b.ReportAllocs()
				seq := uint64(1)
				for b.Loop() {
					tr.Seal(pkt, seq)
					seq++
				}
			})
		}
	}
}

// BenchmarkOpen measures Transform.Open for every suite and size. Open
// works in place, so each iteration first copies the sealed packet back
// into the work buffer; the copy (a memmove of at most 1.5 kB) is
// included in the figure.
func BenchmarkOpen(b *testing.B) {
	for _, name := range benchSuites {
		for _, n := range benchSizes {
			b.Run(name+"/"+strconv.Itoa(n), func(b *testing.B) {
				tr := benchTransform(b, name)
				sealed := layout(tr, 0x100, 1, make([]byte, padded(n, tr.BlockSize())))
				tr.Seal(sealed, 1)
				work := make([]byte, len(sealed))
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					copy(work, sealed)
					if _, err := tr.Open(work, 1); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkRawAEAD measures the bare cipher.AEAD Seal of the standard
// library and x/crypto on the same plaintext lengths and an 8-byte AAD,
// the floor Seal's ESP work adds to.
func BenchmarkRawAEAD(b *testing.B) {
	aeads := []struct {
		name string
		new  func() cipher.AEAD
	}{
		{"aes128gcm16", func() cipher.AEAD { return mustGCM(b, 16) }},
		{"aes256gcm16", func() cipher.AEAD { return mustGCM(b, 32) }},
		{"chacha20poly1305", func() cipher.AEAD {
			a, err := chacha20poly1305.New(randomBytes(32))
			if err != nil {
				b.Fatal(err)
			}
			return a
		}},
	}
	for _, a := range aeads {
		for _, n := range benchSizes {
			b.Run(a.name+"/"+strconv.Itoa(n), func(b *testing.B) {
				aead := a.new()
				buf := make([]byte, padded(n, aeadBlockSize)+aead.Overhead())
				pt := buf[:padded(n, aeadBlockSize)]
				nonce := make([]byte, aead.NonceSize())
				aad := make([]byte, 8)
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					aead.Seal(pt[:0], nonce, pt, aad)
				}
			})
		}
	}
}

func mustGCM(b *testing.B, keyLen int) cipher.AEAD {
	block, err := aes.NewCipher(randomBytes(keyLen))
	if err != nil {
		b.Fatal(err)
	}
	a, err := cipher.NewGCM(block)
	if err != nil {
		b.Fatal(err)
	}
	return a
}
