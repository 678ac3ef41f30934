package crypto

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
)

// cbcTransform is AES-CBC (RFC 3602) with an HMAC integrity algorithm,
// encrypt-then-MAC as RFC 4303 section 3.3.2 orders it: Seal encrypts the
// plaintext, then computes the ICV over SPI | Sequence Number | IV |
// ciphertext (and, with ESN, the high 32 bits of the sequence number);
// Open verifies the ICV in constant time before it decrypts anything.
//
// The IV. RFC 3602 section 2.3 wants an IV that an attacker cannot
// predict. Reading crypto/rand for every packet would cost a system call
// per packet, so New draws, once per SA, a 128-bit AES key K' and a 64-bit
// value r from crypto/rand (both independent of the SA's keys), and Seal
// uses
//
//	IV = AES-Encrypt(K', seq || r)
//
// with seq the 64-bit sequence number. Sequence numbers never repeat
// within an SA, so every input block is distinct, and AES under a key the
// attacker does not know is a pseudorandom permutation: the IVs are
// indistinguishable from distinct random blocks, and seeing any number of
// them tells nothing about the next one. This is the "encrypt a nonce
// with the forward cipher" IV generation of NIST SP 800-38A appendix C,
// with a separate key so that IV generation never touches the data key.
//
// cipher.BlockMode values are not safe for concurrent use: encrypters and
// decrypters live in sync.Pools and are re-aimed with SetIV, which every
// CBC BlockMode of crypto/cipher implements.
type cbcTransform struct {
	state
	block   cipher.Block // K, the SA's encryption key
	ivBlock cipher.Block // K', the IV generation key
	ivSalt  [8]byte      // r
	ivKey   [16]byte     // K' bytes, kept only to be wiped by Zero
	auth    *hmacAuth
	enc     sync.Pool // *cbcMode
	dec     sync.Pool // *cbcMode
}

// ivSetter is implemented by crypto/cipher's CBC encrypters and
// decrypters.
type ivSetter interface{ SetIV([]byte) }

type cbcMode struct {
	mode cipher.BlockMode
	iv   ivSetter
	in   [aes.BlockSize]byte // seq || r, the IV generation input
}

func newCBC(s Suite, encKey, integKey []byte) (Transform, error) {
	block, err := aes.NewCipher(encKey)
	if err != nil {
		return nil, fmt.Errorf("crypto: %v: %w", s, err)
	}
	t := &cbcTransform{block: block, auth: newHMACAuth(s.Integrity, integKey, s.ESN)}
	t.suite = s
	// rand.Read never fails since Go 1.24: it crashes the program instead
	// of returning predictable bytes.
	rand.Read(t.ivKey[:])
	rand.Read(t.ivSalt[:])
	if t.ivBlock, err = aes.NewCipher(t.ivKey[:]); err != nil {
		return nil, fmt.Errorf("crypto: %v: IV key: %w", s, err)
	}
	// Probe once that the modes can be re-aimed, so Seal and Open never
	// have to handle a BlockMode without SetIV.
	if _, err := t.newMode(true); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *cbcTransform) newMode(encrypt bool) (*cbcMode, error) {
	var zero [aes.BlockSize]byte
	m := &cbcMode{}
	if encrypt {
		m.mode = cipher.NewCBCEncrypter(t.block, zero[:])
	} else {
		m.mode = cipher.NewCBCDecrypter(t.block, zero[:])
	}
	iv, ok := m.mode.(ivSetter)
	if !ok {
		return nil, fmt.Errorf("crypto: %v: CBC mode %T has no SetIV", t.suite, m.mode)
	}
	m.iv = iv
	return m, nil
}

func (t *cbcTransform) get(p *sync.Pool, encrypt bool) *cbcMode {
	if m, ok := p.Get().(*cbcMode); ok {
		return m
	}
	m, err := t.newMode(encrypt)
	if err != nil {
		// newCBC probed this; it cannot change at run time.
		panic(err)
	}
	return m
}

// IVSize returns 16, the AES block.
func (t *cbcTransform) IVSize() int { return aes.BlockSize }

// BlockSize returns 16, the AES block.
func (t *cbcTransform) BlockSize() int { return aes.BlockSize }

// ICVSize returns the truncated HMAC length: 12, 16, 24 or 32.
func (t *cbcTransform) ICVSize() int { return t.auth.icvSize }

// Seal writes a fresh IV, encrypts the plaintext in place and appends the
// ICV.
func (t *cbcTransform) Seal(pkt []byte, seq uint64) {
	if t.zeroed.Load() {
		sealZeroed(pkt)
		return
	}
	sealLayout(pkt, aes.BlockSize, aes.BlockSize, t.auth.icvSize)
	m := t.get(&t.enc, true)
	binary.BigEndian.PutUint64(m.in[:8], seq)
	copy(m.in[8:], t.ivSalt[:])
	t.ivBlock.Encrypt(pkt[HeaderLen:HeaderLen+aes.BlockSize], m.in[:])
	t.sealWithIV(m, pkt, seq)
	t.enc.Put(m)
}

// sealIV seals with the given IV instead of a generated one; tests use it
// to replay the RFC 3602 vectors.
func (t *cbcTransform) sealIV(pkt []byte, seq uint64, iv []byte) {
	sealLayout(pkt, aes.BlockSize, aes.BlockSize, t.auth.icvSize)
	m := t.get(&t.enc, true)
	copy(pkt[HeaderLen:HeaderLen+aes.BlockSize], iv)
	t.sealWithIV(m, pkt, seq)
	t.enc.Put(m)
}

// sealWithIV encrypts with the IV already in pkt, then signs.
func (t *cbcTransform) sealWithIV(m *cbcMode, pkt []byte, seq uint64) {
	body := HeaderLen + aes.BlockSize
	pt := pkt[body : len(pkt)-t.auth.icvSize]
	m.iv.SetIV(pkt[HeaderLen:body])
	m.mode.CryptBlocks(pt, pt)
	t.auth.sign(pkt, seq)
}

// Open verifies the ICV, then decrypts in place and returns the
// plaintext.
func (t *cbcTransform) Open(pkt []byte, seq uint64) ([]byte, error) {
	if t.zeroed.Load() {
		return nil, ErrAuthentication
	}
	n, err := openLayout(pkt, aes.BlockSize, aes.BlockSize, t.auth.icvSize)
	if err != nil {
		return nil, err
	}
	if !t.auth.verify(pkt, seq) {
		return nil, ErrAuthentication
	}
	body := HeaderLen + aes.BlockSize
	ct := pkt[body : body+n : body+n]
	m := t.get(&t.dec, false)
	m.iv.SetIV(pkt[HeaderLen:body])
	m.mode.CryptBlocks(ct, ct)
	t.dec.Put(m)
	return ct, nil
}

// Zero wipes the integrity key, the IV generation key and r, drops the
// ciphers and pools, and requests the collection that erases the AES key
// schedules inside crypto/aes and the copies each pooled CBC mode holds
// (secret.go).
func (t *cbcTransform) Zero() {
	t.zeroed.Store(true)
	wipe(t.ivKey[:])
	wipe(t.ivSalt[:])
	t.auth.zero()
	t.block, t.ivBlock = nil, nil
	t.enc, t.dec = sync.Pool{}, sync.Pool{}
	requestErase()
}
