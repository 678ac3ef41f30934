//go:build amd64 && gc && !purego

package chachapoly

import (
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"math/bits"
	"unsafe"

	"golang.org/x/sys/cpu"
)

var (
	// Available reports whether the CPU can run this package (SSSE3).
	Available = cpu.X86.HasSSSE3
	// Preferred reports whether this package is faster here than
	// golang.org/x/crypto, whose assembly needs AVX2 and BMI2.
	Preferred = Available && !(cpu.X86.HasAVX2 && cpu.X86.HasBMI2)
)

// aead is ChaCha20-Poly1305 with one key. It holds no mutable state, so
// it is safe for concurrent use.
type aead struct {
	key [8]uint32
}

// New returns the AEAD of RFC 8439 section 2.8 with the 32-byte key. It
// fails where Available is false. Seal and Open follow cipher.AEAD and
// golang.org/x/crypto/chacha20poly1305: they append to dst, which may be
// the input's [:0] (in place) but must not overlap it otherwise, and Open
// writes nothing to dst when authentication fails.
func New(key []byte) (cipher.AEAD, error) {
	if !Available {
		return nil, errors.New("chachapoly: the CPU has no SSSE3")
	}
	if len(key) != KeySize {
		return nil, errKeySize
	}
	a := new(aead)
	for i := range a.key {
		a.key[i] = binary.LittleEndian.Uint32(key[4*i:])
	}
	return a, nil
}

func (*aead) NonceSize() int { return NonceSize }
func (*aead) Overhead() int  { return Overhead }

// state returns the ChaCha20 state of RFC 8439 section 2.3 with block
// counter 0.
func (a *aead) state(nonce []byte) [16]uint32 {
	if len(nonce) != NonceSize {
		panic("chachapoly: bad nonce length")
	}
	return [16]uint32{
		0x61707865, 0x3320646e, 0x79622d32, 0x6b206574,
		a.key[0], a.key[1], a.key[2], a.key[3], a.key[4], a.key[5], a.key[6], a.key[7],
		0, binary.LittleEndian.Uint32(nonce[0:]), binary.LittleEndian.Uint32(nonce[4:]),
		binary.LittleEndian.Uint32(nonce[8:]),
	}
}

// Seal encrypts and authenticates plaintext and appends the result to dst.
func (a *aead) Seal(dst, nonce, plaintext, ad []byte) []byte {
	st := a.state(nonce)
	if uint64(len(plaintext)) > maxPlaintext {
		panic("chachapoly: plaintext too large")
	}
	ret, out := grow(dst, len(plaintext)+Overhead)
	if inexactOverlap(out, plaintext) || anyOverlap(out, ad) {
		panic("chachapoly: invalid buffer overlap")
	}
	var first [256]byte
	blocks(&st, &first[0], &first[0], len(first))
	m := newMAC(first[:32])
	xorStream(&st, &first, out, plaintext)
	ct := out[:len(plaintext)]
	m.pad(ad)
	m.pad(ct)
	m.lengths(len(ad), len(ct))
	m.sum((*[Overhead]byte)(out[len(plaintext):]))
	return ret
}

// Open authenticates ciphertext and, if it is genuine, decrypts it and
// appends the plaintext to dst. On failure it returns an error and writes
// nothing to dst.
func (a *aead) Open(dst, nonce, ciphertext, ad []byte) ([]byte, error) {
	st := a.state(nonce)
	if len(ciphertext) < Overhead {
		return nil, errOpen
	}
	if uint64(len(ciphertext)) > maxPlaintext+Overhead {
		panic("chachapoly: ciphertext too large")
	}
	ct, tag := ciphertext[:len(ciphertext)-Overhead], ciphertext[len(ciphertext)-Overhead:]
	ret, out := grow(dst, len(ct))
	if inexactOverlap(out, ciphertext) || anyOverlap(out, ad) {
		panic("chachapoly: invalid buffer overlap")
	}
	var first [256]byte
	blocks(&st, &first[0], &first[0], len(first))
	m := newMAC(first[:32])
	m.pad(ad)
	m.pad(ct)
	m.lengths(len(ad), len(ct))
	var want [Overhead]byte
	m.sum(&want)
	if subtle.ConstantTimeCompare(want[:], tag) != 1 {
		return nil, errOpen
	}
	xorStream(&st, &first, out, ct)
	return ret, nil
}

// xorStream XORs src with the key stream from block 1 on into dst. first
// holds blocks 0-3, computed for the Poly1305 key; st's counter is 0.
func xorStream(st *[16]uint32, first *[256]byte, dst, src []byte) {
	n := subtle.XORBytes(dst, src, first[64:])
	dst, src = dst[n:], src[n:]
	st[12] = 4
	if bulk := len(src) &^ 255; bulk > 0 {
		blocks(st, &dst[0], &src[0], bulk)
		st[12] += uint32(bulk / 64)
		dst, src = dst[bulk:], src[bulk:]
	}
	if len(src) > 0 {
		clear(first[:])
		blocks(st, &first[0], &first[0], len(first))
		subtle.XORBytes(dst, src, first[:])
	}
}

// mac is a Poly1305 computation (RFC 8439 section 2.5): h the
// accumulator, r the clamped multiplier and s the final addend.
type mac struct {
	h [3]uint64
	r [2]uint64
	s [2]uint64
}

func newMAC(key []byte) *mac {
	return &mac{
		r: [2]uint64{
			binary.LittleEndian.Uint64(key[0:]) & 0x0ffffffc0fffffff,
			binary.LittleEndian.Uint64(key[8:]) & 0x0ffffffc0ffffffc,
		},
		s: [2]uint64{binary.LittleEndian.Uint64(key[16:]), binary.LittleEndian.Uint64(key[24:])},
	}
}

// pad absorbs b zero-padded to a multiple of 16 bytes (RFC 8439 section
// 2.8).
func (m *mac) pad(b []byte) {
	if full := len(b) &^ 15; full > 0 {
		polyBlocks(&m.h, &m.r, &b[0], full)
		b = b[full:]
	}
	if len(b) > 0 {
		var last [16]byte
		copy(last[:], b)
		polyBlocks(&m.h, &m.r, &last[0], len(last))
	}
}

// lengths absorbs the last block: the AAD and ciphertext lengths.
func (m *mac) lengths(ad, ct int) {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[0:], uint64(ad))
	binary.LittleEndian.PutUint64(b[8:], uint64(ct))
	polyBlocks(&m.h, &m.r, &b[0], len(b))
}

// sum writes the tag: h reduced mod 2^130-5, plus s, mod 2^128. h is
// below 2(2^130-5) after a block step, so one subtraction reduces it.
func (m *mac) sum(tag *[Overhead]byte) {
	h0, h1, h2 := m.h[0], m.h[1], m.h[2]
	g0, b := bits.Sub64(h0, 0xfffffffffffffffb, 0)
	g1, b := bits.Sub64(h1, 0xffffffffffffffff, b)
	_, b = bits.Sub64(h2, 3, b)
	// b == 0: h >= p, take h - p.
	keep := -b // all ones to keep h
	h0 = h0&keep | g0&^keep
	h1 = h1&keep | g1&^keep
	t0, c := bits.Add64(h0, m.s[0], 0)
	t1, _ := bits.Add64(h1, m.s[1], c)
	binary.LittleEndian.PutUint64(tag[0:], t0)
	binary.LittleEndian.PutUint64(tag[8:], t1)
}

// grow returns in with n more bytes and the slice of those bytes.
func grow(in []byte, n int) (head, tail []byte) {
	if total := len(in) + n; cap(in) >= total {
		head = in[:total]
	} else {
		head = make([]byte, total)
		copy(head, in)
	}
	return head, head[len(in):]
}

// anyOverlap reports whether x and y share memory; inexactOverlap
// whether they do other than starting at the same byte.
func anyOverlap(x, y []byte) bool {
	if len(x) == 0 || len(y) == 0 {
		return false
	}
	x0, x1 := uintptr(unsafe.Pointer(&x[0])), uintptr(unsafe.Pointer(&x[len(x)-1]))
	y0, y1 := uintptr(unsafe.Pointer(&y[0])), uintptr(unsafe.Pointer(&y[len(y)-1]))
	return x0 <= y1 && y0 <= x1
}

func inexactOverlap(x, y []byte) bool {
	if len(x) == 0 || len(y) == 0 || &x[0] == &y[0] {
		return false
	}
	return anyOverlap(x, y)
}
