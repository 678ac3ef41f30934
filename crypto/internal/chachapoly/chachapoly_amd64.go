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
// leaves zeros, never plaintext, in what it used of dst when
// authentication fails.
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

// state returns the ChaCha20 state of RFC 8439 section 2.3; the
// assembly takes the block counters separately.
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
//
// The key stream of the first 192 bytes comes with the Poly1305 key, the
// rest in 256-byte chunks. The Poly1305 step over each chunk's ciphertext
// runs in the ChaCha20 iteration after the one that wrote it (the AAD's
// last blocks and the first 192 bytes in the first iteration, the last
// chunk in the one that computes the tail's key stream), so that only
// the tail is hashed alone.
func (a *aead) Seal(dst, nonce, plaintext, ad []byte) []byte {
	st := a.state(nonce)
	if uint64(len(plaintext)) > maxPlaintext {
		panic("chachapoly: plaintext too large")
	}
	ret, out := grow(dst, len(plaintext)+Overhead)
	if inexactOverlap(out, plaintext) || anyOverlap(out, ad) {
		panic("chachapoly: invalid buffer overlap")
	}
	ct := out[:len(plaintext)]
	var ks [256]byte
	var m mac
	m.init(&st, &ks, 0)
	subtle.XORBytes(ct, plaintext, ks[64:])
	rest := ct
	if len(ct) <= 192 {
		m.pad(ad)
	} else {
		rest = sealRest(&st, &m, &ks, ct, plaintext, ad)
	}
	m.last(rest, len(ad), len(ct))
	m.sum((*[Overhead]byte)(out[len(plaintext):]))
	return ret
}

// sealRest encrypts plaintext after its first 192 bytes into ct and
// hashes the AAD and ct up to the rest it returns for the caller to
// hash, the tail after the last whole chunk or that chunk; the first 256 bytes of that from a copy: the
// AAD's last four blocks, or leading zero blocks without the 2^128 bit
// (which leave the accumulator at 0) and the AAD, then ct[:192].
func sealRest(st *[16]uint32, m *mac, ks *[256]byte, ct, plaintext, ad []byte) (rest []byte) {
	var first [256]byte
	var hibit [16]uint64
	adLen := (len(ad) + 15) &^ 15
	if adLen > 64 {
		m.pad(ad[:adLen-64])
		copy(first[:64], ad[adLen-64:])
		hibit[0], hibit[1], hibit[2], hibit[3] = 1, 1, 1, 1
	} else {
		copy(first[64-adLen:], ad)
		for i := (64 - adLen) / 16; i < 4; i++ {
			hibit[i] = 1
		}
	}
	copy(first[64:], ct[:192])
	for i := 4; i < 16; i++ {
		hibit[i] = 1
	}
	hp, hb := &first[0], &hibit
	bulk := (len(ct) - 192) &^ 255
	hashed := 192 // after the first iteration
	if bulk > 0 {
		blocksHash(st, &[4]uint32{4, 5, 6, 7}, &ct[192], &plaintext[192], bulk, &m.h, &m.r, hp, hb, &ct[192])
		hashed = bulk - 256 + 192
		hp, hb = &ct[hashed], &ones
		hashed += 256
	}
	tail := 192 + bulk
	if tail < len(ct) {
		c := uint32(tail/64) + 1
		blocksHash(st, &[4]uint32{c, c + 1, c + 2, c + 3}, &ks[0], &zero[0], len(ks), &m.h, &m.r, hp, hb, hp)
		subtle.XORBytes(ct[tail:], plaintext[tail:], ks[:])
		return ct[tail:]
	}
	return ct[hashed-256:]
}

// Open authenticates ciphertext and, if it is genuine, appends the
// plaintext to dst. On failure it returns an error and the bytes it used
// after dst's length hold zeros, never plaintext.
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
	bulk := len(ct) &^ 255
	var ks [256]byte
	var m mac
	m.init(&st, &ks, bulk)
	m.pad(ad)
	if bulk > 0 {
		// Each iteration hashes its 256 bytes of ciphertext before it
		// writes the plaintext, which may be the same memory.
		next := &ct[0] // read only by a second iteration
		if bulk > 256 {
			next = &ct[256]
		}
		blocksHash(&st, &[4]uint32{1, 2, 3, 4}, &out[0], &ct[0], bulk, &m.h, &m.r, &ct[0], &ones, next)
	}
	m.last(ct[bulk:], len(ad), len(ct))
	var want [Overhead]byte
	m.sum(&want)
	if subtle.ConstantTimeCompare(want[:], tag) != 1 {
		clear(out[:bulk])
		return nil, errOpen
	}
	xorTail(&st, &ks, bulk, out[bulk:], ct[bulk:])
	return ret, nil
}

// zero is the source of a key stream alone and the data of a hash whose
// result is not used; ones are the 2^128 bits of whole message blocks.
var (
	zero [256]byte
	ones = [16]uint64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}
)

// blocks is blocksHash with nothing to hash, for one iteration (256
// bytes): it runs the same code, so that only one ChaCha20 loop takes
// room in the CPU's caches, and hashes zeros into a scratch accumulator.
func blocks(st *[16]uint32, ctr *[4]uint32, dst, src *byte) {
	var h [3]uint64
	var r [2]uint64
	blocksHash(st, ctr, dst, src, 256, &h, &r, &zero[0], &ones, &zero[0])
}

// init computes block 0 of the key stream and keys m with its first 32
// bytes, and computes blocks bulk/64+1 to bulk/64+3, the key stream of
// the 192 bytes after bulk, into ks[64:].
func (m *mac) init(st *[16]uint32, ks *[256]byte, bulk int) {
	c := uint32(bulk / 64)
	blocks(st, &[4]uint32{0, c + 1, c + 2, c + 3}, &ks[0], &zero[0])
	m.r = [2]uint64{
		binary.LittleEndian.Uint64(ks[0:]) & 0x0ffffffc0fffffff,
		binary.LittleEndian.Uint64(ks[8:]) & 0x0ffffffc0ffffffc,
	}
	m.s = [2]uint64{binary.LittleEndian.Uint64(ks[16:]), binary.LittleEndian.Uint64(ks[24:])}
	clear(ks[:64])
}

// xorTail XORs src, the less than 256 bytes after bulk, with the key
// stream: ks[64:] from init, then blocks computed here if needed.
func xorTail(st *[16]uint32, ks *[256]byte, bulk int, dst, src []byte) {
	n := subtle.XORBytes(dst, src, ks[64:])
	if n == len(src) {
		return
	}
	c := uint32(bulk/64) + 4
	blocks(st, &[4]uint32{c, c + 1, c + 2, c + 3}, &ks[0], &zero[0])
	subtle.XORBytes(dst[n:], src[n:], ks[:])
}

// mac is a Poly1305 computation (RFC 8439 section 2.5): h the
// accumulator, r the clamped multiplier and s the final addend.
type mac struct {
	h [3]uint64
	r [2]uint64
	s [2]uint64
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

// last absorbs b zero-padded to a multiple of 16 bytes and then the
// block of the AAD and ciphertext lengths, the end of RFC 8439 section
// 2.8's Poly1305 input, with one call for the last two blocks.
func (m *mac) last(b []byte, ad, ct int) {
	if full := len(b) &^ 15; full > 0 {
		polyBlocks(&m.h, &m.r, &b[0], full)
		b = b[full:]
	}
	var end [32]byte
	n := copy(end[:], b)
	n = (n + 15) &^ 15
	binary.LittleEndian.PutUint64(end[n:], uint64(ad))
	binary.LittleEndian.PutUint64(end[n+8:], uint64(ct))
	polyBlocks(&m.h, &m.r, &end[0], n+16)
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
