package crypto

import (
	"strings"
	"testing"
)

func TestParseSuiteAccepts(t *testing.T) {
	gcm16 := func(bits int) Suite { return Suite{Encryption: EncrAESGCM16, KeyBits: bits} }
	gcm12 := func(bits int) Suite { return Suite{Encryption: EncrAESGCM12, KeyBits: bits} }
	cbc := func(bits int, i IntegrityID) Suite {
		return Suite{Encryption: EncrAESCBC, KeyBits: bits, Integrity: i}
	}
	cases := []struct {
		in   string
		want Suite
		name string // canonical String()
	}{
		{"aes128gcm16", gcm16(128), "aes128gcm16"},
		{"aes128gcm128", gcm16(128), "aes128gcm16"},
		{"aes128gcm", gcm16(128), "aes128gcm16"},
		{"aes192gcm16", gcm16(192), "aes192gcm16"},
		{"aes256gcm128", gcm16(256), "aes256gcm16"},
		{"aes256gcm", gcm16(256), "aes256gcm16"},
		{"aes128gcm12", gcm12(128), "aes128gcm12"},
		{"aes192gcm96", gcm12(192), "aes192gcm12"},
		{"aes256gcm12", gcm12(256), "aes256gcm12"},
		{"chacha20poly1305", Suite{Encryption: EncrChaCha20Poly1305, KeyBits: 256}, "chacha20poly1305"},
		{"aes-sha1", cbc(128, AuthHMACSHA196), "aes128-sha1"},
		{"aes128-sha", cbc(128, AuthHMACSHA196), "aes128-sha1"},
		{"aes256-sha1", cbc(256, AuthHMACSHA196), "aes256-sha1"},
		{"aes128-sha256", cbc(128, AuthHMACSHA2256128), "aes128-sha256"},
		{"aes192-sha2_256", cbc(192, AuthHMACSHA2256128), "aes192-sha256"},
		{"aes256-sha384", cbc(256, AuthHMACSHA2384192), "aes256-sha384"},
		{"aes256-sha2_384", cbc(256, AuthHMACSHA2384192), "aes256-sha384"},
		{"aes256-sha512", cbc(256, AuthHMACSHA2512256), "aes256-sha512"},
		{"sha2_512-aes128", cbc(128, AuthHMACSHA2512256), "aes128-sha512"},
		{"aes128gmac", Suite{Encryption: EncrNullAuthAESGMAC, KeyBits: 128}, "aes128gmac"},
		{"aes192gmac", Suite{Encryption: EncrNullAuthAESGMAC, KeyBits: 192}, "aes192gmac"},
		{"aes256gmac-esn", Suite{Encryption: EncrNullAuthAESGMAC, KeyBits: 256, ESN: true}, "aes256gmac-esn"},
		{"null-sha256", Suite{Encryption: EncrNull, Integrity: AuthHMACSHA2256128}, "null-sha256"},
		{"null-sha1-esn", Suite{Encryption: EncrNull, Integrity: AuthHMACSHA196, ESN: true}, "null-sha1-esn"},
		{"chacha20poly1305-esn", Suite{Encryption: EncrChaCha20Poly1305, KeyBits: 256, ESN: true}, "chacha20poly1305-esn"},
		{"aes128gcm16-noesn", gcm16(128), "aes128gcm16"},
		{"AES256GCM16-ESN", Suite{Encryption: EncrAESGCM16, KeyBits: 256, ESN: true}, "aes256gcm16-esn"},
		// Key exchange methods are ignored.
		{"aes128gcm16-modp2048", gcm16(128), "aes128gcm16"},
		{"aes128-sha256-modp3072-esn", Suite{Encryption: EncrAESCBC, KeyBits: 128, Integrity: AuthHMACSHA2256128, ESN: true}, "aes128-sha256-esn"},
		{"aes256gcm16-ecp256", gcm16(256), "aes256gcm16"},
		{"aes256gcm16-ecp384bp", gcm16(256), "aes256gcm16"},
		{"aes256gcm16-modp1024s160", gcm16(256), "aes256gcm16"},
		{"aes256gcm16-curve25519", gcm16(256), "aes256gcm16"},
		{"aes256gcm16-x25519", gcm16(256), "aes256gcm16"},
		{"aes256gcm16-curve448", gcm16(256), "aes256gcm16"},
		{"aes256gcm16-x448", gcm16(256), "aes256gcm16"},
		{"aes256gcm16-mlkem768", gcm16(256), "aes256gcm16"},
		{"aes256gcm16-x25519-ke1_mlkem768", gcm16(256), "aes256gcm16"},
		{"aes256gcm16-ke1_none", gcm16(256), "aes256gcm16"},
	}
	for _, c := range cases {
		got, err := ParseSuite(c.in)
		if err != nil {
			t.Errorf("ParseSuite(%q): %v", c.in, err)
			continue
		}
		if got != c.want {
			t.Errorf("ParseSuite(%q) = %+v, want %+v", c.in, got, c.want)
		}
		if s := got.String(); s != c.name {
			t.Errorf("ParseSuite(%q).String() = %q, want %q", c.in, s, c.name)
		}
		again, err := ParseSuite(got.String())
		if err != nil || again != got {
			t.Errorf("ParseSuite(%q) = %+v, %v; does not round-trip %+v", got.String(), again, err, got)
		}
	}
}

func TestParseSuiteRefuses(t *testing.T) {
	cases := []struct {
		in, mention string // the error must contain mention
	}{
		{"", "empty"},
		{"3des-sha1", `"3des"`},
		{"des-sha1", `"des"`},
		{"camellia128-sha256", `"camellia128"`},
		{"camellia-sha1", `"camellia"`},
		{"cast128-sha1", `"cast128"`},
		{"blowfish-sha1", `"blowfish"`},
		{"aes128ccm16", `"aes128ccm16"`},
		{"aes256ccm12", "AES-CCM"},
		{"aes128ctr-sha256", `"aes128ctr"`},
		{"aes128-md5", `"md5"`},
		{"aes128-sha256_96", `"sha256_96"`},
		{"aes128-aesxcbc", `"aesxcbc"`},
		{"aes128-aescmac", `"aescmac"`},
		{"aes128gcm8", "12 bytes"},
		{"aes256gcm64", "8-byte"},
		{"aes128gcm16-sha256", "combines"},
		{"chacha20poly1305-sha1", "combines"},
		{"aes128gmac-sha256", "combines"},
		{"aes128", "needs an integrity"},
		{"null", "needs an integrity"},
		{"sha256", "no encryption"},
		{"aes128-aes256-sha256", "two encryption"},
		{"aes128-sha1-sha256", "two integrity"},
		{"aes128-sha256-esn-noesn", "both esn and noesn"},
		{"aes128--sha256", "empty algorithm"},
		{"aes128-sha256-prfsha256", `"prfsha256"`},
		{"aes128-sha256-modp", `"modp"`},
		{"aes128-sha256-ecp", `"ecp"`},
		{"aes128-sha256-frobnicate", `"frobnicate"`},
		{"aes512-sha256", `"aes512"`},
	}
	for _, c := range cases {
		s, err := ParseSuite(c.in)
		if err == nil {
			t.Errorf("ParseSuite(%q) = %v, want an error", c.in, s)
			continue
		}
		if !strings.Contains(err.Error(), c.mention) {
			t.Errorf("ParseSuite(%q) error %q does not mention %q", c.in, err, c.mention)
		}
	}
}

func TestIDNames(t *testing.T) {
	enc := map[EncryptionID]string{
		3: "ENCR_3DES", 11: "ENCR_NULL", 12: "ENCR_AES_CBC", 13: "ENCR_AES_CTR",
		14: "ENCR_AES_CCM_8", 15: "ENCR_AES_CCM_12", 16: "ENCR_AES_CCM_16",
		18: "ENCR_AES_GCM_8", 19: "ENCR_AES_GCM_12", 20: "ENCR_AES_GCM_16",
		21: "ENCR_NULL_AUTH_AES_GMAC", 23: "ENCR_CAMELLIA_CBC", 28: "ENCR_CHACHA20_POLY1305",
		99: "ENCR_99",
	}
	for id, want := range enc {
		if got := id.String(); got != want {
			t.Errorf("EncryptionID(%d) = %q, want %q", id, got, want)
		}
	}
	integ := map[IntegrityID]string{
		0: "NONE", 1: "AUTH_HMAC_MD5_96", 2: "AUTH_HMAC_SHA1_96", 5: "AUTH_AES_XCBC_96",
		12: "AUTH_HMAC_SHA2_256_128", 13: "AUTH_HMAC_SHA2_384_192", 14: "AUTH_HMAC_SHA2_512_256",
		77: "AUTH_77",
	}
	for id, want := range integ {
		if got := id.String(); got != want {
			t.Errorf("IntegrityID(%d) = %q, want %q", id, got, want)
		}
	}
}

func TestKeyLengths(t *testing.T) {
	cases := []struct {
		name       string
		enc, integ int
		aead       bool
	}{
		{"aes128gcm16", 20, 0, true},
		{"aes192gcm16", 28, 0, true},
		{"aes256gcm12", 36, 0, true},
		{"aes128gmac", 20, 0, true},
		{"aes256gmac", 36, 0, true},
		{"chacha20poly1305", 36, 0, true},
		{"aes128-sha1", 16, 20, false},
		{"aes192-sha256", 24, 32, false},
		{"aes256-sha384", 32, 48, false},
		{"aes256-sha512", 32, 64, false},
		{"null-sha256", 0, 32, false},
	}
	for _, c := range cases {
		s, err := ParseSuite(c.name)
		if err != nil {
			t.Fatal(err)
		}
		if s.EncKeyLen() != c.enc || s.IntegKeyLen() != c.integ || s.AEAD() != c.aead {
			t.Errorf("%s: EncKeyLen %d IntegKeyLen %d AEAD %v, want %d %d %v",
				c.name, s.EncKeyLen(), s.IntegKeyLen(), s.AEAD(), c.enc, c.integ, c.aead)
		}
	}
}

func TestSuiteFromIDs(t *testing.T) {
	ok := []struct {
		enc   EncryptionID
		bits  int
		integ IntegrityID
		esn   bool
		want  string
	}{
		{EncrAESGCM16, 128, AuthNone, false, "aes128gcm16"},
		{EncrAESGCM12, 256, AuthNone, true, "aes256gcm12-esn"},
		{EncrChaCha20Poly1305, 0, AuthNone, false, "chacha20poly1305"},
		{EncrChaCha20Poly1305, 256, AuthNone, false, "chacha20poly1305"},
		{EncrNullAuthAESGMAC, 192, AuthNone, false, "aes192gmac"},
		{EncrAESCBC, 256, AuthHMACSHA2512256, false, "aes256-sha512"},
		{EncrNull, 0, AuthHMACSHA196, true, "null-sha1-esn"},
	}
	for _, c := range ok {
		s, err := SuiteFromIDs(c.enc, c.bits, c.integ, c.esn)
		if err != nil {
			t.Errorf("SuiteFromIDs(%v, %d, %v, %v): %v", c.enc, c.bits, c.integ, c.esn, err)
			continue
		}
		if s.String() != c.want {
			t.Errorf("SuiteFromIDs(%v, %d, %v, %v) = %v, want %s", c.enc, c.bits, c.integ, c.esn, s, c.want)
		}
	}
	bad := []struct {
		enc     EncryptionID
		bits    int
		integ   IntegrityID
		mention string
	}{
		{Encr3DES, 192, AuthHMACSHA196, "ENCR_3DES"},
		{EncrAESCTR, 128, AuthHMACSHA196, "ENCR_AES_CTR"},
		{EncrAESCCM16, 128, AuthNone, "ENCR_AES_CCM_16"},
		{EncrAESGCM8, 128, AuthNone, "ENCR_AES_GCM_8"},
		{EncrCamelliaCBC, 128, AuthHMACSHA196, "ENCR_CAMELLIA_CBC"},
		{EncrAESGCM16, 128, AuthHMACSHA196, "AUTH_HMAC_SHA1_96"},
		{EncrAESGCM16, 64, AuthNone, "64 bits"},
		{EncrAESCBC, 0, AuthHMACSHA196, "0 bits"},
		{EncrChaCha20Poly1305, 128, AuthNone, "128 bits"},
		{EncrNull, 128, AuthHMACSHA196, "128 bits"},
		{EncrAESCBC, 128, AuthNone, "needs an integrity"},
		{EncrNull, 0, AuthNone, "needs an integrity"},
		{EncrAESCBC, 128, AuthHMACMD596, "AUTH_HMAC_MD5_96"},
		{EncrAESCBC, 128, AuthAESXCBC96, "AUTH_AES_XCBC_96"},
		{EncryptionID(99), 128, AuthNone, "ENCR_99"},
	}
	for _, c := range bad {
		s, err := SuiteFromIDs(c.enc, c.bits, c.integ, false)
		if err == nil {
			t.Errorf("SuiteFromIDs(%v, %d, %v) = %v, want an error", c.enc, c.bits, c.integ, s)
			continue
		}
		if !strings.Contains(err.Error(), c.mention) {
			t.Errorf("SuiteFromIDs(%v, %d, %v) error %q does not mention %q", c.enc, c.bits, c.integ, err, c.mention)
		}
	}
}
