package chachapoly

import (
	"bytes"
	"testing"

	"golang.org/x/crypto/chacha20poly1305"
)

// FuzzAEAD seals the input with this package and with x/crypto, checks
// that the results are equal, that Open returns the plaintext and that it
// refuses the sealed message with the bit at flip changed. The seeds
// cover the chunk boundaries of the implementation (192, 256, 448 bytes).
func FuzzAEAD(f *testing.F) {
	for _, n := range []int{0, 1, 63, 64, 191, 192, 193, 255, 256, 257, 447, 448, 449, 1402, 4099} {
		pt := bytes.Repeat([]byte{byte(n)}, n)
		f.Add(bytes.Repeat([]byte{byte(n + 1)}, KeySize), []byte("twelve bytes"), []byte("spi+seq!"), pt, uint32(n))
	}
	f.Fuzz(func(t *testing.T, key, nonce, aad, pt []byte, flip uint32) {
		if !Available {
			t.Skip("no SSSE3 implementation here")
		}
		if len(key) != KeySize || len(nonce) != NonceSize {
			return
		}
		mine, err := New(key)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := chacha20poly1305.New(key)
		if err != nil {
			t.Fatal(err)
		}
		sealed := mine.Seal(nil, nonce, pt, aad)
		if want := ref.Seal(nil, nonce, pt, aad); !bytes.Equal(sealed, want) {
			t.Fatalf("Seal\n got %x\nwant %x", sealed, want)
		}
		got, err := mine.Open(nil, nonce, sealed, aad)
		if err != nil || !bytes.Equal(got, pt) {
			t.Fatalf("Open = %x, %v; want %x", got, err, pt)
		}
		bit := int(flip % uint32(8*len(sealed)))
		sealed[bit/8] ^= 1 << (bit % 8)
		if got, err := mine.Open(nil, nonce, sealed, aad); err == nil || got != nil {
			t.Fatalf("Open accepted bit %d changed", bit)
		}
	})
}
