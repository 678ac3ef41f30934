package crypto

import (
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/binary"
	"hash"
	"sync"
)

// hmacAuth computes and checks the truncated HMAC ICVs of RFC 2404
// (HMAC-SHA1-96) and RFC 4868 (HMAC-SHA2-256-128, -384-192, -512-256).
//
// The ICV covers the ESP packet from the SPI to the Next Header; with ESN
// the high 32 bits of the sequence number are appended after the Next
// Header for the computation only, never sent (RFC 4303 section 3.3.2.1,
// RFC 4304 section 2). An HMAC hash.Hash is not safe for concurrent use,
// so each transform keeps a sync.Pool of keyed hashes; Reset returns one
// to its keyed initial state without touching the key again.
type hmacAuth struct {
	newHash func() hash.Hash
	key     []byte
	icvSize int
	esn     bool
	pool    sync.Pool // *macState
}

// macState is one pooled keyed HMAC with scratch that must not escape per
// call: the full digest and the ESN high bits.
type macState struct {
	h   hash.Hash
	sum [sha512.Size]byte
	hi  [4]byte
}

// newHMACAuth returns the HMAC plumbing for integrity algorithm id, keyed
// with a copy of key.
func newHMACAuth(id IntegrityID, key []byte, esn bool) *hmacAuth {
	a := &hmacAuth{key: append([]byte(nil), key...), esn: esn}
	switch id {
	case AuthHMACSHA196:
		a.newHash, a.icvSize = sha1.New, 12
	case AuthHMACSHA2256128:
		a.newHash, a.icvSize = sha256.New, 16
	case AuthHMACSHA2384192:
		a.newHash, a.icvSize = sha512.New384, 24
	case AuthHMACSHA2512256:
		a.newHash, a.icvSize = sha512.New, 32
	default:
		// Callers pass only what Suite.Validate accepted.
		panic("crypto: no HMAC for " + id.String())
	}
	return a
}

func (a *hmacAuth) get() *macState {
	if m, ok := a.pool.Get().(*macState); ok {
		m.h.Reset()
		return m
	}
	return &macState{h: hmac.New(a.newHash, a.key)}
}

func (a *hmacAuth) put(m *macState) {
	clear(m.sum[:])
	a.pool.Put(m)
}

// compute returns the full HMAC of data (and the ESN high bits) in m.sum.
func (a *hmacAuth) compute(m *macState, data []byte, seq uint64) []byte {
	m.h.Write(data)
	if a.esn {
		binary.BigEndian.PutUint32(m.hi[:], uint32(seq>>32))
		m.h.Write(m.hi[:])
	}
	return m.h.Sum(m.sum[:0])
}

// sign writes the ICV of pkt[:len(pkt)-icvSize] into the last icvSize
// bytes of pkt.
func (a *hmacAuth) sign(pkt []byte, seq uint64) {
	end := len(pkt) - a.icvSize
	m := a.get()
	copy(pkt[end:], a.compute(m, pkt[:end], seq))
	a.put(m)
}

// verify reports, in constant time, whether the last icvSize bytes of pkt
// are the ICV of the rest.
func (a *hmacAuth) verify(pkt []byte, seq uint64) bool {
	end := len(pkt) - a.icvSize
	m := a.get()
	sum := a.compute(m, pkt[:end], seq)
	ok := subtle.ConstantTimeCompare(sum[:a.icvSize], pkt[end:]) == 1
	a.put(m)
	return ok
}

// zero wipes the integrity key copy and drops the pool; the keyed HMAC
// states (inner and outer pads) inside the pooled crypto/hmac hashes are
// erased by the collection the transform's Zero requests (secret.go).
func (a *hmacAuth) zero() {
	wipe(a.key)
	a.key = nil
	a.pool = sync.Pool{}
}
