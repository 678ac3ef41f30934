package crypto

import (
	"crypto/cipher"
	"encoding/binary"
	"sync"
)

// aeadIVSize is the explicit IV that RFC 4106, 4543 and 7634 carry in
// every packet.
const aeadIVSize = 8

// aeadBlockSize is the plaintext alignment of the stream-like AEADs: ESP's
// own 4-byte alignment (RFC 4303 section 2.4).
const aeadBlockSize = 4

// aeadTransform implements the ESP rules that AES-GCM (RFC 4106) and
// ChaCha20-Poly1305 (RFC 7634) share:
//
//   - the key material is the cipher key followed by a 4-byte salt;
//   - the nonce is salt || IV, where the 8-byte IV is sent after the ESP
//     header; espd uses the 64-bit sequence number, big-endian, as the IV,
//     which never repeats under one key because sequence numbers never
//     cycle within an SA (RFC 4303 section 3.3.3);
//   - the AAD is SPI || Sequence Number (8 bytes) or, with ESN,
//     SPI || high 32 bits || low 32 bits (12 bytes);
//   - the ciphertext replaces the plaintext in place and the tag is the ICV.
//
// cipher.AEAD implementations from the standard library and x/crypto are
// safe for concurrent use; the nonce and AAD scratch is pooled because a
// local array passed to an interface method escapes to the heap.
type aeadTransform struct {
	state
	aead    cipher.AEAD
	salt    [saltLen]byte
	icvSize int
	scratch sync.Pool // *aeadScratch
}

// aeadScratch holds the per-call nonce and ESN AAD.
type aeadScratch struct {
	nonce [saltLen + aeadIVSize]byte
	aad   [12]byte
}

func newAEADTransform(s Suite, a cipher.AEAD, salt []byte) *aeadTransform {
	t := &aeadTransform{aead: a, icvSize: a.Overhead()}
	t.suite = s
	copy(t.salt[:], salt)
	return t
}

// IVSize returns 8, the explicit IV of RFC 4106 and RFC 7634.
func (t *aeadTransform) IVSize() int { return aeadIVSize }

// BlockSize returns 4: these AEADs encrypt any length, ESP aligns to 4.
func (t *aeadTransform) BlockSize() int { return aeadBlockSize }

// ICVSize returns the tag length: 16, or 12 for ENCR_AES_GCM_12.
func (t *aeadTransform) ICVSize() int { return t.icvSize }

// Seal writes seq as the IV, encrypts the plaintext in place and appends
// the tag. It reads the SPI and the low sequence number from pkt's header.
func (t *aeadTransform) Seal(pkt []byte, seq uint64) {
	if t.zeroed.Load() {
		sealZeroed(pkt)
		return
	}
	sealLayout(pkt, aeadIVSize, aeadBlockSize, t.icvSize)
	t.sealIV(pkt, seq, seq)
}

// sealIV seals with an explicit IV; tests use it to replay published
// vectors whose IV is not the sequence number.
func (t *aeadTransform) sealIV(pkt []byte, seq, iv uint64) {
	binary.BigEndian.PutUint64(pkt[HeaderLen:], iv)
	s := t.get()
	nonce, aad := t.nonceAAD(s, pkt, seq)
	pt := pkt[HeaderLen+aeadIVSize : len(pkt)-t.icvSize]
	t.aead.Seal(pt[:0], nonce, pt, aad)
	t.put(s)
}

// Open verifies and decrypts pkt in place and returns the plaintext.
func (t *aeadTransform) Open(pkt []byte, seq uint64) ([]byte, error) {
	if t.zeroed.Load() {
		return nil, ErrAuthentication
	}
	n, err := openLayout(pkt, aeadIVSize, aeadBlockSize, t.icvSize)
	if err != nil {
		return nil, err
	}
	s := t.get()
	nonce, aad := t.nonceAAD(s, pkt, seq)
	ct := pkt[HeaderLen+aeadIVSize:]
	_, err = t.aead.Open(ct[:0], nonce, ct, aad)
	t.put(s)
	if err != nil {
		return nil, ErrAuthentication
	}
	return ct[:n:n], nil
}

// nonceAAD fills s with salt || IV (the IV read from pkt) and returns the
// nonce and the AAD. Without ESN the AAD is the ESP header itself.
func (t *aeadTransform) nonceAAD(s *aeadScratch, pkt []byte, seq uint64) (nonce, aad []byte) {
	copy(s.nonce[:saltLen], t.salt[:])
	copy(s.nonce[saltLen:], pkt[HeaderLen:HeaderLen+aeadIVSize])
	if !t.suite.ESN {
		return s.nonce[:], pkt[:HeaderLen]
	}
	return s.nonce[:], esnAAD(&s.aad, pkt, seq)
}

// esnAAD writes SPI || seq high 32 bits || Sequence Number field.
func esnAAD(aad *[12]byte, pkt []byte, seq uint64) []byte {
	copy(aad[0:4], pkt[0:4])
	binary.BigEndian.PutUint32(aad[4:8], uint32(seq>>32))
	copy(aad[8:12], pkt[4:8])
	return aad[:]
}

func (t *aeadTransform) get() *aeadScratch {
	if s, ok := t.scratch.Get().(*aeadScratch); ok {
		return s
	}
	return new(aeadScratch)
}

func (t *aeadTransform) put(s *aeadScratch) {
	clear(s.nonce[:saltLen])
	t.scratch.Put(s)
}

// Zero wipes the salt, drops the cipher and requests the collection that
// erases its key schedule (secret.go).
func (t *aeadTransform) Zero() {
	t.zeroed.Store(true)
	wipe(t.salt[:])
	t.aead = nil
	requestErase()
}
