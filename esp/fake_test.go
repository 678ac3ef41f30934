package esp

import (
	"encoding/binary"
	"hash/crc64"

	"github.com/espd/espd/crypto"
)

// fakeTransform is a test-only Transform with the shape of a NULL-or-XOR
// cipher and an HMAC-like keyed checksum: a keyed XOR keystream over the
// plaintext and a keyed CRC-64 ICV over header, IV, ciphertext and (with
// ESN) the high sequence bits. CRC-64 catches every single-bit change, which
// is what the tampering tests need; it is of course no MAC.
type fakeTransform struct {
	iv, bs, icv int
	key         byte
	esn         bool
}

var crcTable = crc64.MakeTable(crc64.ECMA)

func (f *fakeTransform) Suite() crypto.Suite {
	return crypto.Suite{ESN: f.esn}
}
func (f *fakeTransform) IVSize() int    { return f.iv }
func (f *fakeTransform) BlockSize() int { return f.bs }
func (f *fakeTransform) ICVSize() int   { return f.icv }
func (f *fakeTransform) Zero()          { f.key = 0 }

func (f *fakeTransform) icvOf(dst, data []byte, seq uint64) {
	c := crc64.Update(uint64(f.key)*0x9e3779b97f4a7c15, crcTable, data)
	if f.esn {
		var hi [4]byte
		binary.BigEndian.PutUint32(hi[:], uint32(seq>>32))
		c = crc64.Update(c, crcTable, hi[:])
	}
	for i := range dst {
		dst[i] = byte(c>>(8*(i%8))) ^ byte(i/8*0x3b)
	}
}

func (f *fakeTransform) xor(pt []byte, seq uint64) {
	for i := range pt {
		pt[i] ^= f.key ^ byte(seq) ^ byte(i*7)
	}
}

func (f *fakeTransform) Seal(pkt []byte, seq uint64) {
	for i := range f.iv {
		pkt[HeaderLen+i] = byte(seq>>(8*(i%8))) ^ 0xa5
	}
	pt := pkt[HeaderLen+f.iv : len(pkt)-f.icv]
	if len(pt)%f.bs != 0 {
		panic("fake: plaintext not aligned")
	}
	f.xor(pt, seq)
	f.icvOf(pkt[len(pkt)-f.icv:], pkt[:len(pkt)-f.icv], seq)
}

func (f *fakeTransform) Open(pkt []byte, seq uint64) ([]byte, error) {
	if len(pkt) < HeaderLen+f.iv+f.icv || (len(pkt)-HeaderLen-f.iv-f.icv)%f.bs != 0 {
		return nil, crypto.ErrMalformed
	}
	var want [64]byte
	f.icvOf(want[:f.icv], pkt[:len(pkt)-f.icv], seq)
	if string(want[:f.icv]) != string(pkt[len(pkt)-f.icv:]) {
		return nil, crypto.ErrAuthentication
	}
	pt := pkt[HeaderLen+f.iv : len(pkt)-f.icv]
	f.xor(pt, seq)
	return pt, nil
}

// fakes are the test transforms: AEAD-like, CBC-like and NULL-like shapes.
func fakes(esn bool) []*fakeTransform {
	return []*fakeTransform{
		{iv: 8, bs: 4, icv: 16, key: 1, esn: esn},
		{iv: 16, bs: 16, icv: 12, key: 2, esn: esn},
		{iv: 0, bs: 4, icv: 32, key: 3, esn: esn},
	}
}
