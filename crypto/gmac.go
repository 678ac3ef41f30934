package crypto

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"fmt"
	"sync"
)

// gmacICVSize is the only ICV length RFC 4543 defines for ESP.
const gmacICVSize = 16

// gmacTransform is ENCR_NULL_AUTH_AES_GMAC (RFC 4543): authentication
// without confidentiality. Keying, nonce (salt || 8-byte IV) and IV choice
// (the 64-bit sequence number) are those of AES-GCM, but nothing is
// encrypted: the whole packet up to the ICV, SPI, Sequence Number, IV,
// payload, padding, Pad Length and Next Header, is GCM's additional data,
// the GCM plaintext is empty and the 16-byte tag is the ICV. With ESN the
// high 32 bits of the sequence number sit between the SPI and the
// Sequence Number field, as in RFC 4106's AAD:
//
//	SPI | [seq high 32] | Sequence Number | IV | payload ... Next Header
//
// Go's AEAD interface takes the AAD as one slice, so with ESN Seal and
// Open move the packet body up by 4 bytes (into the ICV room, whose
// contents are saved first) to lay the AAD out contiguously, and move it
// back afterwards. Without ESN the packet is the AAD as it stands.
type gmacTransform struct {
	state
	aead    cipher.AEAD
	salt    [saltLen]byte
	scratch sync.Pool // *gmacScratch
}

type gmacScratch struct {
	nonce [saltLen + aeadIVSize]byte
	tag   [gmacICVSize]byte
}

func newGMAC(s Suite, key []byte) (Transform, error) {
	n := len(key) - saltLen
	block, err := aes.NewCipher(key[:n])
	if err != nil {
		return nil, fmt.Errorf("crypto: %v: %w", s, err)
	}
	a, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("crypto: %v: %w", s, err)
	}
	t := &gmacTransform{aead: a}
	t.suite = s
	copy(t.salt[:], key[n:])
	return t, nil
}

// IVSize returns 8.
func (t *gmacTransform) IVSize() int { return aeadIVSize }

// BlockSize returns 4: nothing is encrypted, ESP aligns to 4.
func (t *gmacTransform) BlockSize() int { return aeadBlockSize }

// ICVSize returns 16.
func (t *gmacTransform) ICVSize() int { return gmacICVSize }

// Seal writes seq as the IV and the GMAC of the packet as the ICV. The
// plaintext stays in the clear.
func (t *gmacTransform) Seal(pkt []byte, seq uint64) {
	if t.zeroed.Load() {
		sealZeroed(pkt)
		return
	}
	sealLayout(pkt, aeadIVSize, aeadBlockSize, gmacICVSize)
	t.sealIV(pkt, seq, seq)
}

func (t *gmacTransform) sealIV(pkt []byte, seq, iv uint64) {
	binary.BigEndian.PutUint64(pkt[HeaderLen:], iv)
	s := t.get()
	nonce := t.nonce(s, pkt)
	end := len(pkt) - gmacICVSize
	if !t.suite.ESN {
		t.aead.Seal(pkt[end:end], nonce, nil, pkt[:end])
	} else {
		aad := spreadESN(pkt, end, seq)
		t.aead.Seal(s.tag[:0], nonce, nil, aad)
		unspreadESN(pkt, end)
		copy(pkt[end:], s.tag[:])
	}
	t.put(s)
}

// Open verifies the ICV and returns the payload, which was never
// encrypted.
func (t *gmacTransform) Open(pkt []byte, seq uint64) ([]byte, error) {
	if t.zeroed.Load() {
		return nil, ErrAuthentication
	}
	n, err := openLayout(pkt, aeadIVSize, aeadBlockSize, gmacICVSize)
	if err != nil {
		return nil, err
	}
	s := t.get()
	nonce := t.nonce(s, pkt)
	end := len(pkt) - gmacICVSize
	if !t.suite.ESN {
		_, err = t.aead.Open(pkt[end:end], nonce, pkt[end:], pkt[:end])
	} else {
		copy(s.tag[:], pkt[end:])
		aad := spreadESN(pkt, end, seq)
		_, err = t.aead.Open(s.tag[:0], nonce, s.tag[:], aad)
		unspreadESN(pkt, end)
		copy(pkt[end:], s.tag[:])
	}
	t.put(s)
	if err != nil {
		return nil, ErrAuthentication
	}
	body := HeaderLen + aeadIVSize
	return pkt[body : body+n : body+n], nil
}

// spreadESN moves pkt[4:end] up by 4 bytes and writes the high 32 bits of
// seq at pkt[4:8], so that pkt[:end+4] is SPI | high | low | IV | payload.
// end+4 <= len(pkt) because the ICV room follows.
func spreadESN(pkt []byte, end int, seq uint64) []byte {
	copy(pkt[8:end+4], pkt[4:end])
	binary.BigEndian.PutUint32(pkt[4:8], uint32(seq>>32))
	return pkt[:end+4]
}

// unspreadESN undoes spreadESN.
func unspreadESN(pkt []byte, end int) {
	copy(pkt[4:end], pkt[8:end+4])
}

func (t *gmacTransform) nonce(s *gmacScratch, pkt []byte) []byte {
	copy(s.nonce[:saltLen], t.salt[:])
	copy(s.nonce[saltLen:], pkt[HeaderLen:HeaderLen+aeadIVSize])
	return s.nonce[:]
}

func (t *gmacTransform) get() *gmacScratch {
	if s, ok := t.scratch.Get().(*gmacScratch); ok {
		return s
	}
	return new(gmacScratch)
}

func (t *gmacTransform) put(s *gmacScratch) {
	clear(s.nonce[:saltLen])
	t.scratch.Put(s)
}

// Zero wipes the salt, drops the cipher and requests the collection that
// erases its key schedule (secret.go).
func (t *gmacTransform) Zero() {
	t.zeroed.Store(true)
	wipe(t.salt[:])
	t.aead = nil
	requestErase()
}
