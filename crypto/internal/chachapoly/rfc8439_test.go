package chachapoly

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// The vectors of RFC 8439: sections 2.3.2 (block function), 2.4.2
// (encryption), 2.8.2 (AEAD) and Appendix A.5 (AEAD decryption).

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func need(t *testing.T) {
	t.Helper()
	if !Available {
		t.Skip("no SSSE3 implementation in this build or on this CPU")
	}
}

// aeadVector is an RFC 8439 AEAD example.
type aeadVector struct {
	name                         string
	key, nonce, aad, pt, ct, tag string
}

var aeadVectors = []aeadVector{{
	name:  "2.8.2",
	key:   "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f",
	nonce: "070000004041424344454647",
	aad:   "50515253c0c1c2c3c4c5c6c7",
	pt: hex.EncodeToString([]byte("Ladies and Gentlemen of the class of '99: If I could offer you " +
		"only one tip for the future, sunscreen would be it.")),
	ct: "d31a8d34648e60db7b86afbc53ef7ec2a4aded51296e08fea9e2b5a736ee62d6" +
		"3dbea45e8ca9671282fafb69da92728b1a71de0a9e060b2905d6a5b67ecd3b36" +
		"92ddbd7f2d778b8c9803aee328091b58fab324e4fad675945585808b4831d7bc" +
		"3ff4def08e4b7a9de576d26586cec64b6116",
	tag: "1ae10b594f09e26a7e902ecbd0600691",
}, {
	name:  "A.5",
	key:   "1c9240a5eb55d38af333888604f6b5f0473917c1402b80099dca5cbc207075c0",
	nonce: "000000000102030405060708",
	aad:   "f33388860000000000004e91",
	pt: hex.EncodeToString([]byte("Internet-Drafts are draft documents valid for a maximum of six " +
		"months and may be updated, replaced, or obsoleted by other documents at any time. It is " +
		"inappropriate to use Internet-Drafts as reference material or to cite them other than as " +
		"/\u201cwork in progress./\u201d")),
	ct: "64a0861575861af460f062c79be643bd5e805cfd345cf389f108670ac76c8cb2" +
		"4c6cfc18755d43eea09ee94e382d26b0bdb7b73c321b0100d4f03b7f355894cf" +
		"332f830e710b97ce98c8a84abd0b948114ad176e008d33bd60f982b1ff37c855" +
		"9797a06ef4f0ef61c186324e2b3506383606907b6a7c02b0f9f6157b53c867e4" +
		"b9166c767b804d46a59b5216cde7a4e99040c5a40433225ee282a1b0a06c523e" +
		"af4534d7f83fa1155b0047718cbc546a0d072b04b3564eea1b422273f548271a" +
		"0bb2316053fa76991955ebd63159434ecebb4e466dae5a1073a6727627097a10" +
		"49e617d91d361094fa68f0ff77987130305beaba2eda04df997b714d6c6f2c29" +
		"a6ad5cb4022b02709b",
	tag: "eead9d67890cbb22392336fea1851f38",
}}

func TestRFC8439AEAD(t *testing.T) {
	need(t)
	for _, v := range aeadVectors {
		a, err := New(mustHex(t, v.key))
		if err != nil {
			t.Fatal(err)
		}
		nonce, aad, pt := mustHex(t, v.nonce), mustHex(t, v.aad), mustHex(t, v.pt)
		sealed := append(mustHex(t, v.ct), mustHex(t, v.tag)...)
		if got := a.Seal(nil, nonce, pt, aad); !bytes.Equal(got, sealed) {
			t.Errorf("%s: Seal\n got %x\nwant %x", v.name, got, sealed)
		}
		got, err := a.Open(nil, nonce, sealed, aad)
		if err != nil || !bytes.Equal(got, pt) {
			t.Errorf("%s: Open = %q, %v; want %q", v.name, got, err, pt)
		}
		sealed[len(sealed)-1] ^= 1
		if _, err := a.Open(nil, nonce, sealed, aad); err == nil {
			t.Errorf("%s: Open accepted a changed tag", v.name)
		}
	}
}
