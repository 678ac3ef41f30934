package crypto

import (
	"crypto/sha256"
	"encoding/binary"
)

// Fingerprint identifies an SA's keying material without revealing it: a
// SHA-256 digest, one-way, so that it may be kept where the key may not
// (on disk, in a core dump, after the SA is gone).
type Fingerprint [sha256.Size]byte

// fingerprintTag separates these digests from any other use of SHA-256.
const fingerprintTag = "espd key fingerprint v1\x00"

// KeyFingerprint returns the fingerprint of an SA's encryption key (salt
// included) and integrity key. Equal keys give equal fingerprints whatever
// the suite: two suites keyed with the same bytes share a nonce space, and
// espd treats them as the same key.
//
// It leaves no copy of the keys in memory it does not wipe: the digest's
// input is a buffer of whole SHA-256 blocks, which the hash reads in place
// (nothing is buffered inside the digest), and that buffer is cleared
// before it returns.
func KeyFingerprint(encKey, integKey []byte) Fingerprint {
	n := len(fingerprintTag) + 4 + len(encKey) + 4 + len(integKey)
	n = (n + sha256.BlockSize - 1) / sha256.BlockSize * sha256.BlockSize
	buf := make([]byte, n)
	off := copy(buf, fingerprintTag)
	binary.BigEndian.PutUint32(buf[off:], uint32(len(encKey)))
	off += 4
	off += copy(buf[off:], encKey)
	binary.BigEndian.PutUint32(buf[off:], uint32(len(integKey)))
	off += 4
	copy(buf[off:], integKey)
	fp := Fingerprint(sha256.Sum256(buf))
	clear(buf)
	return fp
}
