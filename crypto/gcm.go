package crypto

import (
	"crypto/aes"
	"crypto/cipher"
	"fmt"
)

// newGCM returns the AES-GCM transform of RFC 4106 (ENCR_AES_GCM_16 and
// ENCR_AES_GCM_12): key is the AES key followed by the 4-byte salt
// (RFC 4106 section 8.1). The ICV is the GCM tag, 16 or 12 bytes; 8-byte
// tags (ENCR_AES_GCM_8) are refused by Validate because crypto/cipher
// does not produce tags shorter than 12 bytes. The IV and AAD rules are
// those of aeadTransform.
func newGCM(s Suite, key []byte) (Transform, error) {
	n := len(key) - saltLen
	block, err := aes.NewCipher(key[:n])
	if err != nil {
		return nil, fmt.Errorf("crypto: %v: %w", s, err)
	}
	tag := 16
	if s.Encryption == EncrAESGCM12 {
		tag = 12
	}
	a, err := cipher.NewGCMWithTagSize(block, tag)
	if err != nil {
		return nil, fmt.Errorf("crypto: %v: %w", s, err)
	}
	return newAEADTransform(s, a, key[n:]), nil
}
