// Package crypto holds the ESP transforms: the confidentiality and integrity
// algorithms of RFC 4303 behind one small interface that knows ESP's IV, salt,
// AAD and ICV rules (RFC 4106, 4543, 7634, 3602, 2404, 4868, 2410).
//
// A Transform works in place on an ESP packet laid out as
//
//	SPI (4) | Sequence Number (4) | IV (IVSize) | plaintext | ICV (ICVSize)
//
// where plaintext is the payload, TFC and ESP padding, Pad Length and Next
// Header. The caller (package esp) writes the header and the plaintext and
// leaves room for the IV and the ICV; Seal fills them in.
//
// Families, one file each: aead.go holds the IV and AAD rules AES-GCM
// (gcm.go, RFC 4106) and ChaCha20-Poly1305 (chacha20poly1305.go, RFC 7634)
// share; gmac.go is AES-GMAC (RFC 4543); cbc.go is AES-CBC (RFC 3602) with
// an HMAC; null.go is NULL encryption (RFC 2410) with an HMAC; hmac.go is
// the truncated HMAC plumbing (RFC 2404, RFC 4868).
//
// Nothing on the data path allocates: ciphers that are safe for concurrent
// use (cipher.AEAD, cipher.Block) are shared, and what is not (HMAC
// hash.Hash, CBC cipher.BlockMode) or would escape to the heap (nonce and
// AAD scratch) lives in per-transform sync.Pools.
package crypto

import "errors"

// Transform seals and opens the ESP packets of one SA. Implementations are
// safe for concurrent use by many goroutines and do not allocate per packet.
type Transform interface {
	// Suite returns the algorithms this transform implements.
	Suite() Suite
	// IVSize returns the number of IV bytes carried after the ESP header.
	IVSize() int
	// BlockSize returns the alignment that the plaintext (payload, padding,
	// Pad Length and Next Header) must have; at least 4 as RFC 4303 requires.
	BlockSize() int
	// ICVSize returns the length of the Integrity Check Value at the end.
	ICVSize() int
	// Seal writes the IV, encrypts the plaintext and appends the ICV, in
	// place. pkt spans the ESP header, IVSize bytes of room, the plaintext
	// (a positive multiple of BlockSize) and ICVSize bytes of room. seq is
	// the full 64-bit sequence number: AEAD transforms use it as the IV,
	// and with ESN its high 32 bits are authenticated. The SPI and the low
	// 32 bits are read from the header the caller wrote. A pkt without
	// that layout is a bug in the caller, not network input: Seal panics,
	// as cipher.AEAD.Seal does for a nonce of the wrong size.
	Seal(pkt []byte, seq uint64)
	// Open verifies the ICV and decrypts pkt in place; pkt spans the ESP
	// header through the ICV. seq is the full (ESN-inferred) sequence number.
	// It returns the plaintext, a sub-slice of pkt. The error is
	// ErrAuthentication when the ICV does not verify and ErrMalformed when
	// pkt cannot be a packet of this transform (too short, misaligned).
	Open(pkt []byte, seq uint64) ([]byte, error)
	// Zero erases the key material the transform holds (its copies of the
	// integrity key, salt and IV generation key), drops its ciphers and
	// asks for the garbage collection that erases them: key schedules
	// inside crypto/aes, crypto/cipher and crypto/hmac are not reachable
	// from outside those packages, but were allocated under DoSecret, so
	// the collector zeroes them as it frees them (secret.go; only in a
	// binary built with GOEXPERIMENT=runtimesecret, SecretErasure). Zero
	// must not run while a Seal or Open is in
	// progress; afterwards Open fails with ErrAuthentication and Seal
	// wipes the packet after the header, so that no plaintext leaves.
	Zero()
}

// Errors returned by Transform.Open and New.
var (
	// ErrAuthentication means the ICV did not verify: the packet was
	// tampered with, or the keys do not match.
	ErrAuthentication = errors.New("esp: integrity check failed")
	// ErrMalformed means the packet is too short or not aligned for the
	// transform.
	ErrMalformed = errors.New("esp: malformed packet for transform")
)

// HeaderLen is the length of the ESP header: SPI and sequence number.
const HeaderLen = 8
