package crypto

import (
	"fmt"
	"sync/atomic"
)

// New returns the transform for suite s keyed with encKey (s.EncKeyLen()
// bytes, salt last) and integKey (s.IntegKeyLen() bytes). It copies the
// keys: the caller may wipe its slices once New returns.
func New(s Suite, encKey, integKey []byte) (Transform, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if len(encKey) != s.EncKeyLen() {
		return nil, fmt.Errorf("crypto: %v needs %d bytes of encryption key, got %d", s, s.EncKeyLen(), len(encKey))
	}
	if len(integKey) != s.IntegKeyLen() {
		return nil, fmt.Errorf("crypto: %v needs %d bytes of integrity key, got %d", s, s.IntegKeyLen(), len(integKey))
	}
	switch s.Encryption {
	case EncrAESGCM12, EncrAESGCM16:
		return newGCM(s, encKey)
	case EncrChaCha20Poly1305:
		return newChaCha20Poly1305(s, encKey)
	case EncrNullAuthAESGMAC:
		return newGMAC(s, encKey)
	case EncrAESCBC:
		return newCBC(s, encKey, integKey)
	case EncrNull:
		return newNull(s, integKey)
	}
	// Validate refused everything else.
	return nil, fmt.Errorf("crypto: no transform for %v", s)
}

// state is what every transform shares: its suite and whether Zero ran.
type state struct {
	suite  Suite
	zeroed atomic.Bool
}

// Suite returns the algorithms of the transform.
func (st *state) Suite() Suite { return st.suite }

// sealLayout checks the layout Seal requires and returns the plaintext
// length. A wrong layout is a bug in the caller, never a property of
// network input, so Seal panics as cipher.AEAD.Seal does for a bad nonce.
func sealLayout(pkt []byte, ivSize, blockSize, icvSize int) int {
	n := len(pkt) - HeaderLen - ivSize - icvSize
	if n <= 0 || n%blockSize != 0 {
		panic(fmt.Sprintf("crypto: Seal: %d-byte packet leaves %d bytes of plaintext, not a positive multiple of %d (header %d, IV %d, ICV %d)",
			len(pkt), n, blockSize, HeaderLen, ivSize, icvSize))
	}
	return n
}

// openLayout returns the ciphertext length of a received packet, or
// ErrMalformed when pkt cannot be a packet of the transform: too short
// for the header, IV, ICV and one block, or not aligned to the block size
// (RFC 4303 section 2.4 makes senders align the ciphertext).
func openLayout(pkt []byte, ivSize, blockSize, icvSize int) (int, error) {
	n := len(pkt) - HeaderLen - ivSize - icvSize
	if n <= 0 || n%blockSize != 0 {
		return 0, ErrMalformed
	}
	return n, nil
}

// sealZeroed handles Seal on a transform whose keys were erased: the
// plaintext must not leave in the clear, so everything after the header is
// wiped and the peer drops the packet on its ICV.
func sealZeroed(pkt []byte) {
	clear(pkt[min(HeaderLen, len(pkt)):])
}

// wipe overwrites key material.
func wipe(b []byte) {
	clear(b)
}
