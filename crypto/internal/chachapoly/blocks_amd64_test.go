//go:build amd64 && gc && !purego

package chachapoly

import (
	"bytes"
	"testing"
)

// The ChaCha20 vectors of RFC 8439 sections 2.3.2 and 2.4.2, run on the
// assembly directly.

const rfcKey = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

func TestRFC8439BlockFunction(t *testing.T) {
	need(t)
	a, err := New(mustHex(t, rfcKey))
	if err != nil {
		t.Fatal(err)
	}
	st := a.(*aead).state(mustHex(t, "000000090000004a00000000"))
	var out [256]byte
	blocks(&st, &[4]uint32{1, 2, 3, 4}, &out[0], &out[0])
	want := mustHex(t, "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"+
		"d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e")
	if !bytes.Equal(out[:64], want) {
		t.Errorf("block 1\n got %x\nwant %x", out[:64], want)
	}
}

func TestRFC8439Encryption(t *testing.T) {
	need(t)
	a, err := New(mustHex(t, rfcKey))
	if err != nil {
		t.Fatal(err)
	}
	pt := []byte("Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it.")
	want := mustHex(t, "6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0b"+
		"f91b65c5524733ab8f593dabcd62b3571639d624e65152ab8f530c359f0861d8"+
		"07ca0dbf500d6a6156a38e088a22b65e52bc514d16ccf806818ce91ab7793736"+
		"5af90bbf74a35be6b40b8eedf2785e42874d")
	st := a.(*aead).state(mustHex(t, "000000000000004a00000000"))
	var buf [256]byte
	copy(buf[:], pt)
	blocks(&st, &[4]uint32{1, 2, 3, 4}, &buf[0], &buf[0])
	if got := buf[:len(pt)]; !bytes.Equal(got, want) {
		t.Errorf("ciphertext\n got %x\nwant %x", got, want)
	}
}
