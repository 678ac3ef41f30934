package crypto

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// TestScapyVectors opens every packet of testdata/scapy_vectors.json, made
// by scapy's ESP implementation (and, where scapy 2.5 falls short, by
// python3-cryptography and Python's hmac: see the generator,
// testdata/scapy_vectors.py), and compares the plaintext byte for byte.
// Every packet is then sealed again from its plaintext, through the IV
// seam for AES-CBC, and must come out identical: for the AEAD suites the
// IV is the sequence number, as espd's Seal chooses it.
func TestScapyVectors(t *testing.T) {
	var vs []espVector
	loadJSON(t, "scapy_vectors.json", &vs)
	if len(vs) < 100 {
		t.Fatalf("only %d vectors", len(vs))
	}
	suites := map[Suite]bool{}
	for _, v := range vs {
		tr := v.transform(t)
		suites[tr.Suite()] = true
		checkOpen(t, v, tr)

		want := unhex(t, v.Packet)
		pkt := sealedLike(t, v, tr)
		seq := v.seq(t)
		if tc, ok := tr.(*cbcTransform); ok {
			tc.sealIV(pkt, seq, unhex(t, v.IV))
		} else {
			if tr.IVSize() == 8 && !bytes.Equal(unhex(t, v.IV), binary.BigEndian.AppendUint64(nil, seq)) {
				t.Fatalf("%s: IV %s is not the sequence number", v.Name, v.IV)
			}
			tr.Seal(pkt, seq)
		}
		if !bytes.Equal(pkt, want) {
			t.Errorf("%s (%s): Seal\n got %x\nwant %x", v.Name, v.Source, pkt, want)
		}
	}
	// Every implemented family, with and without ESN.
	for _, name := range []string{"aes128gcm16", "aes256gcm12", "chacha20poly1305", "aes128gmac",
		"aes128-sha1", "aes256-sha256", "aes192-sha384", "aes256-sha512", "null-sha256"} {
		for _, esn := range []string{"", "-esn"} {
			s, err := ParseSuite(name + esn)
			if err != nil {
				t.Fatal(err)
			}
			if !suites[s] {
				t.Errorf("no vector for %v", s)
			}
		}
	}
}
