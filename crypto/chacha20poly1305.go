package crypto

import (
	"crypto/cipher"
	"fmt"

	"github.com/espd/espd/crypto/internal/chachapoly"
	"golang.org/x/crypto/chacha20poly1305"
)

// newChaCha20Poly1305 returns the ChaCha20-Poly1305 transform of RFC 7634
// (ENCR_CHACHA20_POLY1305): key is the 256-bit ChaCha20 key followed by
// the 4-byte salt (RFC 7634 section 2), the nonce is salt || 8-byte IV and
// the ICV is the 16-byte Poly1305 tag. The IV and AAD rules are those of
// aeadTransform, the same as AES-GCM's (RFC 7634 section 2.1).
// The AEAD is newChaChaAEAD's.
func newChaCha20Poly1305(s Suite, key []byte) (Transform, error) {
	n := len(key) - saltLen
	a, err := newChaChaAEAD(key[:n])
	if err != nil {
		return nil, fmt.Errorf("crypto: %v: %w", s, err)
	}
	return newAEADTransform(s, a, key[n:]), nil
}

// newChaChaAEAD returns espd's own SSSE3 implementation
// (crypto/internal/chachapoly) on an amd64 CPU with SSSE3 but without
// AVX2 and BMI2, the Atom and Celeron class where golang.org/x/crypto
// runs generic Go since v0.52.0, and x/crypto's everywhere else: its
// AVX2 assembly, or its code for the architecture.
func newChaChaAEAD(key []byte) (cipher.AEAD, error) {
	if chachapoly.Preferred {
		return chachapoly.New(key)
	}
	return chacha20poly1305.New(key)
}
