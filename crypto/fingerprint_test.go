package crypto

import (
	"bytes"
	"testing"
)

func TestKeyFingerprint(t *testing.T) {
	k1 := bytes.Repeat([]byte{0x11}, 20)
	k2 := bytes.Repeat([]byte{0x22}, 20)
	a := KeyFingerprint(k1, nil)
	if a != KeyFingerprint(bytes.Clone(k1), nil) {
		t.Fatal("equal keys give different fingerprints")
	}
	if a == KeyFingerprint(k2, nil) {
		t.Fatal("different keys give equal fingerprints")
	}
	// The lengths are part of the input: moving bytes from one key to the
	// other changes the fingerprint.
	if KeyFingerprint(k1[:10], k1[10:]) == KeyFingerprint(k1, nil) {
		t.Fatal("split keys collide with the whole key")
	}
	if bytes.Contains(a[:], k1[:8]) {
		t.Fatal("fingerprint contains key bytes")
	}
	// Inputs around the block boundary all hash.
	for n := 0; n < 130; n++ {
		KeyFingerprint(make([]byte, n), make([]byte, n/2))
	}
}
