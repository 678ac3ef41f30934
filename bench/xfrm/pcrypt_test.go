package xfrm

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/espd/espd/crypto"
)

// TestCryptoUserAlg checks struct crypto_user_alg as sent to the kernel
// (include/uapi/linux/cryptouser.h): three 64-byte NUL-terminated names,
// then cru_type and cru_mask.
func TestCryptoUserAlg(t *testing.T) {
	a := cryptoUserAlg{name: "seqiv(rfc4106(gcm(aes)))", driver: "pcrypt(seqiv(rfc4106-generic))", typ: cryptoAlgTypeAEAD, mask: cryptoAlgTypeMask}
	b := a.Serialize()
	if len(b) != 208 || a.Len() != 208 {
		t.Fatalf("%d bytes (Len %d), want 208", len(b), a.Len())
	}
	cstr := func(b []byte) string { s, _, _ := strings.Cut(string(b), "\x00"); return s }
	if got := cstr(b[0:64]); got != a.name {
		t.Errorf("cru_name %q", got)
	}
	if got := cstr(b[64:128]); got != a.driver {
		t.Errorf("cru_driver_name %q", got)
	}
	if got := cstr(b[128:192]); got != "" {
		t.Errorf("cru_module_name %q", got)
	}
	if typ, mask := binary.NativeEndian.Uint32(b[192:]), binary.NativeEndian.Uint32(b[196:]); typ != 3 || mask != 0xf {
		t.Errorf("cru_type %d, cru_mask %#x", typ, mask)
	}
	if err := cryptoUser(0x10, cryptoUserAlg{name: strings.Repeat("x", 64)}, -1); err == nil || !strings.Contains(err.Error(), "longer than 63") {
		t.Errorf("a 64-byte name: %v", err)
	}
}

const procCryptoSample = `name         : rfc4106(gcm(aes))
driver       : pcrypt(rfc4106(gcm_base(ctr(aes-generic),ghash-generic)))
module       : kernel
priority     : 200
refcnt       : 5
selftest     : passed
type         : aead

name         : seqiv(rfc4106(gcm(aes)))
driver       : seqiv(pcrypt(rfc4106(gcm_base(ctr(aes-generic),ghash-generic))))
module       : seqiv
priority     : 200
refcnt       : 3
type         : aead

name         : rfc4106(gcm(aes))
driver       : rfc4106(gcm_base(ctr(aes-generic),ghash-generic))
module       : gcm
priority     : 100
refcnt       : 2
type         : aead
`

// TestProcCrypto parses /proc/crypto's format and picks what the kernel
// picks: the highest priority of a name.
func TestProcCrypto(t *testing.T) {
	algs, err := parseProcCrypto(strings.NewReader(procCryptoSample))
	if err != nil {
		t.Fatal(err)
	}
	if len(algs) != 3 || algs[0].Priority != 200 || algs[0].Refcnt != 5 || algs[1].Module != "seqiv" || algs[2].Type != "aead" {
		t.Fatalf("parsed %+v", algs)
	}
	pick, plain := best(algs, "rfc4106(gcm(aes))")
	if pick == nil || !strings.HasPrefix(pick.Driver, "pcrypt(") || plain == nil || plain.Driver != "rfc4106(gcm_base(ctr(aes-generic),ghash-generic))" {
		t.Errorf("best: pick %+v plain %+v", pick, plain)
	}
	if pick, _ := best(algs, GenivName("rfc4106(gcm(aes))")); pick == nil || pick.Refcnt != 3 || !strings.Contains(pick.Driver, "(pcrypt(") {
		t.Errorf("best of the IV generator's name: %+v", pick)
	}
	if pick, plain := best(algs, "cbc(aes)"); pick != nil || plain != nil {
		t.Errorf("best of a name not there: %+v %+v", pick, plain)
	}
	// This machine's own table parses, whatever it holds.
	if _, err := ProcCrypto(); err != nil {
		t.Logf("no /proc/crypto here: %v", err)
	}
}

// TestKernelOnlyAlgorithms checks the kernel names and key sizes of the
// CBC ciphers espd refuses, and that their bad variants are refused.
func TestKernelOnlyAlgorithms(t *testing.T) {
	for _, c := range []struct {
		s     crypto.Suite
		crypt string
		enc   int
		auth  string
		trunc int
	}{
		{crypto.Suite{Encryption: crypto.Encr3DES, KeyBits: 192, Integrity: crypto.AuthHMACSHA196}, "cbc(des3_ede)", 24, "hmac(sha1)", 96},
		{crypto.Suite{Encryption: crypto.EncrCamelliaCBC, KeyBits: 128, Integrity: crypto.AuthHMACSHA2256128}, "cbc(camellia)", 16, "hmac(sha256)", 128},
		{crypto.Suite{Encryption: crypto.EncrCamelliaCBC, KeyBits: 256, Integrity: crypto.AuthHMACSHA2512256}, "cbc(camellia)", 32, "hmac(sha512)", 256},
	} {
		aead, crypt, auth, err := Algorithms(c.s, key(c.enc, 1), key(c.s.IntegKeyLen(), 2))
		if err != nil {
			t.Fatalf("%v: %v", c.s, err)
		}
		if aead != nil || crypt.Name != c.crypt || len(crypt.Key) != c.enc || auth.Name != c.auth || auth.TruncateLen != c.trunc {
			t.Errorf("%v: crypt %+v auth %+v", c.s, crypt, auth)
		}
	}
	for _, bad := range []crypto.Suite{
		{Encryption: crypto.Encr3DES, KeyBits: 128, Integrity: crypto.AuthHMACSHA196},
		{Encryption: crypto.EncrCamelliaCBC, KeyBits: 160, Integrity: crypto.AuthHMACSHA196},
		{Encryption: crypto.Encr3DES, KeyBits: 192},
		{Encryption: crypto.EncrCamelliaCBC, KeyBits: 128, Integrity: crypto.AuthHMACMD596},
	} {
		if _, _, _, err := Algorithms(bad, key(bad.EncKeyLen(), 1), key(bad.IntegKeyLen(), 2)); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
