package crypto

import (
	"fmt"

	"golang.org/x/crypto/chacha20poly1305"
)

// newChaCha20Poly1305 returns the ChaCha20-Poly1305 transform of RFC 7634
// (ENCR_CHACHA20_POLY1305): key is the 256-bit ChaCha20 key followed by
// the 4-byte salt (RFC 7634 section 2), the nonce is salt || 8-byte IV and
// the ICV is the 16-byte Poly1305 tag. The IV and AAD rules are those of
// aeadTransform, the same as AES-GCM's (RFC 7634 section 2.1).
// golang.org/x/crypto picks an assembly implementation where one exists
// (AVX2, or SSSE3 on CPUs without AVX2: go.mod keeps x/crypto at v0.51.0
// for that) and a portable one elsewhere, which is what makes this the
// fast suite on CPUs without AES instructions.
func newChaCha20Poly1305(s Suite, key []byte) (Transform, error) {
	n := len(key) - saltLen
	a, err := chacha20poly1305.New(key[:n])
	if err != nil {
		return nil, fmt.Errorf("crypto: %v: %w", s, err)
	}
	return newAEADTransform(s, a, key[n:]), nil
}
