package chachapoly

import (
	"crypto/cipher"
	"strconv"
	"testing"

	"golang.org/x/crypto/chacha20poly1305"
)

// BenchmarkSeal compares this package's Seal with golang.org/x/crypto's on
// the same CPU: run it with GODEBUG=cpu.avx2=off to see x/crypto's path
// for a CPU without AVX2 (BENCHMARKS.md, "ChaCha20-Poly1305 without AVX2").
func BenchmarkSeal(b *testing.B) {
	impls := []struct {
		name string
		new  func([]byte) (cipher.AEAD, error)
	}{{"espd", New}, {"xcrypto", chacha20poly1305.New}}
	for _, im := range impls {
		for _, n := range []int{64, 1402, 8192} {
			b.Run(im.name+"/"+strconv.Itoa(n), func(b *testing.B) {
				a, err := im.new(make([]byte, KeySize))
				if err != nil {
					b.Skip(err)
				}
				buf := make([]byte, n+Overhead)
				nonce, aad := make([]byte, NonceSize), make([]byte, 8)
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					a.Seal(buf[:0], nonce, buf[:n], aad)
				}
			})
		}
	}
}
