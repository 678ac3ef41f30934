package system

import (
	"context"
	"strings"
	"testing"

	"github.com/espd/espd/crypto"
)

// TestParseSuite checks the kernel-only suites the harness names itself
// beside crypto's, their names, and what it refuses.
func TestParseSuite(t *testing.T) {
	for _, c := range []struct {
		in, name string
		want     crypto.Suite
	}{
		{"3des-sha1", "3des-sha1", crypto.Suite{Encryption: crypto.Encr3DES, KeyBits: 192, Integrity: crypto.AuthHMACSHA196}},
		{"3DES-SHA256", "3des-sha256", crypto.Suite{Encryption: crypto.Encr3DES, KeyBits: 192, Integrity: crypto.AuthHMACSHA2256128}},
		{"camellia128-sha256", "camellia128-sha256", crypto.Suite{Encryption: crypto.EncrCamelliaCBC, KeyBits: 128, Integrity: crypto.AuthHMACSHA2256128}},
		{"camellia-sha1", "camellia128-sha1", crypto.Suite{Encryption: crypto.EncrCamelliaCBC, KeyBits: 128, Integrity: crypto.AuthHMACSHA196}},
		{"camellia256-sha512", "camellia256-sha512", crypto.Suite{Encryption: crypto.EncrCamelliaCBC, KeyBits: 256, Integrity: crypto.AuthHMACSHA2512256}},
		{"aes256-sha384", "aes256-sha384", crypto.Suite{Encryption: crypto.EncrAESCBC, KeyBits: 256, Integrity: crypto.AuthHMACSHA2384192}},
		{"aes128gcm16", "aes128gcm16", crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128}},
	} {
		s, err := ParseSuite(c.in)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if s != c.want || SuiteName(s) != c.name {
			t.Errorf("%s: %+v named %q, want %+v named %q", c.in, s, SuiteName(s), c.want, c.name)
		}
		if back, err := ParseSuite(SuiteName(s)); err != nil || back != s {
			t.Errorf("%s: its name %q parses to %+v, %v", c.in, SuiteName(s), back, err)
		}
	}
	for _, bad := range []string{"3des", "3des-", "3des-md5", "camellia-sha1-sha256", "des-sha1", "blowfish-sha1", "camellia512-sha1", "aes128-sha256_96"} {
		if s, err := ParseSuite(bad); err == nil {
			t.Errorf("%q parsed as %+v", bad, s)
		}
	}
}

// TestRefusedByEspd checks that espd's systems turn espd's refusal of a
// kernel-only suite into RefusedByEspd, before touching anything, and
// that pcrypt refuses CBC suites with its reason.
func TestRefusedByEspd(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"3des-sha1", "camellia128-sha256"} {
		s, err := ParseSuite(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, sys := range []System{NewEspd("espd", "espd", "", false), NewEspd("espd-udp", "espd, ESP-in-UDP", "", true),
			NewEspdXDP("espd-xdp", "espd, raw ESP, AF_XDP receive", "", "auto"), NewCharon(CharonEspd)} {
			err := sys.Key(ctx, s)
			if !IsUnavailable(err) || err.Error() != RefusedByEspd {
				t.Errorf("%s keyed for %s: %v, want %q", sys.Name(), name, err, RefusedByEspd)
			}
		}
	}
	for _, name := range []string{"aes128-sha256", "3des-sha1"} {
		s, _ := ParseSuite(name)
		err := (&XFRM{Pcrypt: true}).Key(ctx, s)
		if !IsUnavailable(err) || !strings.Contains(err.Error(), "pcrypt wraps AEADs only") {
			t.Errorf("xfrm-pcrypt keyed for %s: %v", name, err)
		}
	}
	if s, _ := ParseSuite("aes128gcm16"); refusedByEspd(s) != nil {
		t.Errorf("aes128gcm16 refused: %v", refusedByEspd(s))
	}
}
