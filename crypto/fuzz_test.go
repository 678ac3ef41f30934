package crypto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// fuzzSuites are the transforms FuzzOpen drives: every family, with and
// without ESN, keyed deterministically so the committed seed corpus
// (testdata/fuzz/FuzzOpen) holds packets that authenticate.
var fuzzSuites = []string{
	"aes128gcm16", "aes256gcm12-esn", "chacha20poly1305-esn", "aes128gmac",
	"aes256gmac-esn", "aes128-sha1", "aes256-sha512-esn", "null-sha256",
}

// fuzzTransform returns the deterministic transform for fuzzSuites[i].
func fuzzTransform(t testing.TB, i int) Transform {
	s, err := ParseSuite(fuzzSuites[i])
	if err != nil {
		t.Fatal(err)
	}
	key := func(n int, b byte) []byte {
		k := make([]byte, n)
		for j := range k {
			k[j] = b + byte(j)
		}
		return k
	}
	tr, err := New(s, key(s.EncKeyLen(), 0x40), key(s.IntegKeyLen(), 0x90))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// fuzzSeeds returns sealed packets of every fuzz suite and some broken
// ones.
func fuzzSeeds(t testing.TB) []struct {
	which uint8
	seq   uint64
	pkt   []byte
} {
	var out []struct {
		which uint8
		seq   uint64
		pkt   []byte
	}
	for i := range fuzzSuites {
		tr := fuzzTransform(t, i)
		for _, seq := range []uint64{1, 1<<32 | 77} {
			pt := bytes.Repeat([]byte{byte(i), 0x45}, 3*tr.BlockSize())
			pkt := layout(tr, 0x1000+uint32(i), seq, pt)
			tr.Seal(pkt, seq)
			out = append(out, struct {
				which uint8
				seq   uint64
				pkt   []byte
			}{uint8(i), seq, pkt})
		}
		out = append(out, struct {
			which uint8
			seq   uint64
			pkt   []byte
		}{uint8(i), 3, make([]byte, HeaderLen+tr.IVSize()+tr.ICVSize()+1)})
	}
	return out
}

// FuzzOpen feeds arbitrary packets to Open. Open must not panic, must
// return ErrMalformed exactly when the length cannot be a packet of the
// transform and ErrAuthentication otherwise, unless the packet
// authenticates; a packet that authenticates must seal back, from its
// plaintext and IV, to the very same bytes.
func FuzzOpen(f *testing.F) {
	trs := make([]Transform, len(fuzzSuites))
	for i := range trs {
		trs[i] = fuzzTransform(f, i)
	}
	for _, s := range fuzzSeeds(f) {
		f.Add(s.which, s.seq, s.pkt)
	}
	f.Fuzz(func(t *testing.T, which uint8, seq uint64, pkt []byte) {
		tr := trs[int(which)%len(trs)]
		in := append([]byte(nil), pkt...)
		got, err := tr.Open(in, seq)
		body := len(pkt) - HeaderLen - tr.IVSize() - tr.ICVSize()
		aligned := body > 0 && body%tr.BlockSize() == 0
		switch {
		case errors.Is(err, ErrMalformed):
			if aligned {
				t.Fatalf("%v: ErrMalformed for a %d-byte packet", tr.Suite(), len(pkt))
			}
			return
		case errors.Is(err, ErrAuthentication):
			if !aligned {
				t.Fatalf("%v: ErrAuthentication for a malformed %d-byte packet", tr.Suite(), len(pkt))
			}
			return
		case err != nil:
			t.Fatalf("%v: unexpected error %v", tr.Suite(), err)
		}
		if len(got) != body {
			t.Fatalf("%v: %d bytes of plaintext from a %d-byte body", tr.Suite(), len(got), body)
		}
		again := make([]byte, len(pkt))
		copy(again, pkt[:HeaderLen])
		copy(again[HeaderLen+tr.IVSize():], got)
		iv := pkt[HeaderLen : HeaderLen+tr.IVSize()]
		switch x := tr.(type) {
		case *aeadTransform:
			x.sealIV(again, seq, binary.BigEndian.Uint64(iv))
		case *gmacTransform:
			x.sealIV(again, seq, binary.BigEndian.Uint64(iv))
		case *cbcTransform:
			x.sealIV(again, seq, iv)
		default:
			tr.Seal(again, seq)
		}
		if !bytes.Equal(again, pkt) {
			t.Fatalf("%v: authenticated packet does not seal back\n got %x\nwant %x", tr.Suite(), again, pkt)
		}
	})
}
