package crypto

// nullBlockSize is ESP's own 4-byte alignment: NULL encryption has no
// block (RFC 2410 section 2.4 gives it a block size of 1).
const nullBlockSize = 4

// nullTransform is ENCR_NULL (RFC 2410) with an HMAC integrity algorithm:
// no IV, the plaintext is sent as it is and the ICV is the truncated HMAC
// of SPI | Sequence Number | plaintext (with ESN, the high 32 bits of the
// sequence number appended for the computation, RFC 4303 section
// 3.3.2.1).
type nullTransform struct {
	state
	auth *hmacAuth
}

func newNull(s Suite, integKey []byte) (Transform, error) {
	t := &nullTransform{auth: newHMACAuth(s.Integrity, integKey, s.ESN)}
	t.suite = s
	return t, nil
}

// IVSize returns 0.
func (t *nullTransform) IVSize() int { return 0 }

// BlockSize returns 4.
func (t *nullTransform) BlockSize() int { return nullBlockSize }

// ICVSize returns the truncated HMAC length.
func (t *nullTransform) ICVSize() int { return t.auth.icvSize }

// Seal appends the ICV; the plaintext is not touched.
func (t *nullTransform) Seal(pkt []byte, seq uint64) {
	if t.zeroed.Load() {
		sealZeroed(pkt)
		return
	}
	sealLayout(pkt, 0, nullBlockSize, t.auth.icvSize)
	t.auth.sign(pkt, seq)
}

// Open verifies the ICV in constant time and returns the plaintext.
func (t *nullTransform) Open(pkt []byte, seq uint64) ([]byte, error) {
	if t.zeroed.Load() {
		return nil, ErrAuthentication
	}
	n, err := openLayout(pkt, 0, nullBlockSize, t.auth.icvSize)
	if err != nil {
		return nil, err
	}
	if !t.auth.verify(pkt, seq) {
		return nil, ErrAuthentication
	}
	return pkt[HeaderLen : HeaderLen+n : HeaderLen+n], nil
}

// Zero wipes the integrity key and drops the HMAC pool.
func (t *nullTransform) Zero() {
	t.zeroed.Store(true)
	t.auth.zero()
	requestErase()
}
