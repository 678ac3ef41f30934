package xfrm

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/espd/espd/crypto"
)

// A /proc/crypto of a kernel with AES-NI after the plain XFRM row keyed
// aes128gcm16 and aes128-sha256, and a pcrypt instance on AES-NI's driver.
const procCryptoAESNI = `name         : rfc4106(gcm(aes))
driver       : rfc4106-gcm-aesni
module       : aesni_intel
priority     : 400
type         : aead

name         : rfc4106(gcm(aes))
driver       : pcrypt(rfc4106-gcm-aesni)
module       : pcrypt
priority     : 500
type         : aead

name         : seqiv(rfc4106(gcm(aes)))
driver       : seqiv(rfc4106-gcm-aesni)
module       : seqiv
priority     : 400
type         : aead

name         : rfc4106(gcm(aes))
driver       : rfc4106(gcm_base(ctr(aes-generic),ghash-generic))
module       : gcm
priority     : 100
type         : aead

name         : cbc(aes)
driver       : cbc-aes-aesni
module       : aesni_intel
priority     : 400
type         : skcipher

name         : echainiv(authenc(hmac(sha256),cbc(aes)))
driver       : echainiv(authenc(hmac(sha256-avx2),cbc-aes-aesni))
module       : echainiv
priority     : 3000
type         : aead

name         : aes
driver       : aes-generic
module       : aes_generic
priority     : 100
type         : cipher
`

// The same kernel while ForceGeneric holds the AEAD's generic driver and
// cbc(aes-generic), with pcrypt on the generic AEAD, after states of both
// suites were added.
const procCryptoForced = procCryptoAESNI + `
name         : rfc4106(gcm(aes))
driver       : pcrypt(rfc4106(gcm_base(ctr(aes-generic),ghash-generic)))
module       : pcrypt
priority     : 9100
type         : aead

name         : seqiv(rfc4106(gcm(aes)))
driver       : seqiv(pcrypt(rfc4106(gcm_base(ctr(aes-generic),ghash-generic))))
module       : seqiv
priority     : 9100
type         : aead

name         : cbc(aes)
driver       : cbc(aes-generic)
module       : kernel
priority     : 9000
type         : skcipher

name         : echainiv(authenc(hmac(sha256),cbc(aes)))
driver       : echainiv(authenc(hmac(sha256-avx2),cbc(aes-generic)))
module       : echainiv
priority     : 9000
type         : aead
`

func parse(t *testing.T, s string) []CryptoAlg {
	t.Helper()
	algs, err := parseProcCrypto(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return algs
}

// TestGenericDriverOf checks the generic driver and the ESP transform's
// name of every suite the -noaesni twins key.
func TestGenericDriverOf(t *testing.T) {
	for _, c := range []struct {
		s              crypto.Suite
		generic, espTf string
	}{
		{crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128}, "rfc4106(gcm_base(ctr(aes-generic),ghash-generic))", "seqiv(rfc4106(gcm(aes)))"},
		{crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 256}, "rfc4106(gcm_base(ctr(aes-generic),ghash-generic))", "seqiv(rfc4106(gcm(aes)))"},
		{crypto.Suite{Encryption: crypto.EncrChaCha20Poly1305, KeyBits: 256}, "rfc7539esp(chacha20-generic,poly1305-generic)", "seqiv(rfc7539esp(chacha20,poly1305))"},
		{crypto.Suite{Encryption: crypto.EncrNullAuthAESGMAC, KeyBits: 128}, "rfc4543(gcm_base(ctr(aes-generic),ghash-generic))", "seqiv(rfc4543(gcm(aes)))"},
		{crypto.Suite{Encryption: crypto.EncrAESCBC, KeyBits: 128, Integrity: crypto.AuthHMACSHA2256128}, "cbc(aes-generic)", "echainiv(authenc(hmac(sha256),cbc(aes)))"},
		{crypto.Suite{Encryption: crypto.EncrAESCBC, KeyBits: 256, Integrity: crypto.AuthHMACSHA2384192}, "cbc(aes-generic)", "echainiv(authenc(hmac(sha384),cbc(aes)))"},
		{crypto.Suite{Encryption: crypto.Encr3DES, KeyBits: 192, Integrity: crypto.AuthHMACSHA196}, "cbc(des3_ede-generic)", "echainiv(authenc(hmac(sha1),cbc(des3_ede)))"},
		{crypto.Suite{Encryption: crypto.EncrCamelliaCBC, KeyBits: 128, Integrity: crypto.AuthHMACSHA2256128}, "cbc(camellia-generic)", "echainiv(authenc(hmac(sha256),cbc(camellia)))"},
	} {
		aead, crypt, auth, err := Algorithms(c.s, key(c.s.EncKeyLen(), 1), key(c.s.IntegKeyLen(), 2))
		if err != nil {
			t.Fatalf("%v: %v", c.s, err)
		}
		var name, espName string
		if aead != nil {
			name, espName = aead.Name, ESPName(aead.Name, "", "")
		} else {
			name, espName = crypt.Name, ESPName("", crypt.Name, auth.Name)
		}
		if got := GenericDriverOf(name); got != c.generic || espName != c.espTf {
			t.Errorf("%s: generic %q, ESP transform %q; want %q, %q", SuiteName(c.s), got, espName, c.generic, c.espTf)
		}
		if len(GenericDriverOf(name)) >= 64 || len("pcrypt("+GenericDriverOf(name)+")") >= 64 {
			t.Errorf("%s: %q is too long for crypto_user (63 bytes)", name, GenericDriverOf(name))
		}
	}
	// The CBC template builds an lskcipher (type 4) since 6.7: the mask
	// must take it as well as a skcipher (type 5), as the kernel's own
	// CRYPTO_ALG_TYPE_SKCIPHER_MASK does; an AEAD is matched exactly.
	for name, gd := range genericDrivers {
		want := uint32(0xf)
		if strings.HasPrefix(name, "cbc(") {
			want = 0xe
			if (0x4^gd.typ)&gd.mask != 0 || (0x5^gd.typ)&gd.mask != 0 || (0x3^gd.typ)&gd.mask == 0 {
				t.Errorf("%s: type %#x mask %#x does not match an lskcipher and a skcipher only", name, gd.typ, gd.mask)
			}
		}
		if gd.mask != want {
			t.Errorf("%s: mask %#x, want %#x", name, gd.mask, want)
		}
	}
	if got := GenericDriverOf("ecb(cipher_null)"); got != "" {
		t.Errorf("a generic driver for cipher_null: %q", got)
	}
	if _, err := ForceGeneric("ecb(cipher_null)"); !isUnavailable(err) || !strings.Contains(err.Error(), "no generic kernel driver known") {
		t.Errorf("ForceGeneric(ecb(cipher_null)): %v", err)
	}
}

func isUnavailable(err error) bool {
	var ue *UnavailableError
	return errors.As(err, &ue)
}

// TestForcePlan checks what ForceGeneric reads from /proc/crypto: the
// priority to restore, the drivers whose instances it retires (AES-NI's
// and the pcrypt instance on it, never the generic one), and its refusals.
func TestForcePlan(t *testing.T) {
	algs := parse(t, procCryptoAESNI)
	prio, retire, err := forcePlan(algs, "rfc4106(gcm(aes))", GenericDriverOf("rfc4106(gcm(aes))"))
	if err != nil || prio != 100 || strings.Join(retire, " ") != "rfc4106-gcm-aesni pcrypt(rfc4106-gcm-aesni)" {
		t.Errorf("rfc4106: priority %d, retire %q, %v", prio, retire, err)
	}
	if _, _, err := forcePlan(algs, "cbc(aes)", "cbc(aes-generic)"); err == nil || !strings.Contains(err.Error(), "not in /proc/crypto") {
		t.Errorf("a driver not instantiated: %v", err)
	}
	stale := parse(t, procCryptoAESNI+"\nname : rfc4106(gcm(aes))\ndriver : rfc4106-other\npriority : 9000\n")
	if _, _, err := forcePlan(stale, "rfc4106(gcm(aes))", GenericDriverOf("rfc4106(gcm(aes))")); err == nil || !strings.Contains(err.Error(), "rfc4106-other has priority 9000") {
		t.Errorf("a competitor at ForcedPriority: %v", err)
	}
}

// TestUses checks the verdicts on the transform the kernel's ESP picked:
// before forcing, the AES-NI driver fails the no-AES-NI twins; after, the
// generic driver (through pcrypt for xfrm-pcrypt-noaesni) passes, and
// plain XFRM refuses a pcrypt transform.
func TestUses(t *testing.T) {
	gcm, cbc := GenericDriverOf("rfc4106(gcm(aes))"), GenericDriverOf("cbc(aes)")
	gcmTf, cbcTf := ESPName("rfc4106(gcm(aes))", "", ""), ESPName("", "cbc(aes)", "hmac(sha256)")
	before, after := parse(t, procCryptoAESNI), parse(t, procCryptoForced)
	for _, c := range []struct {
		algs    []CryptoAlg
		espName string
		pcrypt  bool
		on      []string
		want    string // the driver, or the error's text
		ok      bool
	}{
		{before, gcmTf, false, nil, "seqiv(rfc4106-gcm-aesni)", true},
		{before, gcmTf, false, []string{gcm}, "not one on " + gcm, false},
		{before, cbcTf, false, []string{cbc}, "not one on cbc(aes-generic)", false},
		{after, gcmTf, true, []string{gcm, "pcrypt(" + gcm + ")"}, "seqiv(pcrypt(" + gcm + "))", true},
		{after, gcmTf, false, []string{gcm}, "it would run through pcrypt", false},
		{after, gcmTf, true, []string{"pcrypt(rfc4106-gcm-aesni)"}, "not one on pcrypt(rfc4106-gcm-aesni)", false},
		{after, cbcTf, false, []string{cbc}, "echainiv(authenc(hmac(sha256-avx2),cbc(aes-generic)))", true},
		{after, "seqiv(rfc7539esp(chacha20,poly1305))", false, nil, "no seqiv(rfc7539esp(chacha20,poly1305)) in /proc/crypto", false},
	} {
		driver, err := Uses(c.algs, c.espName, c.pcrypt, c.on...)
		switch {
		case c.ok && (err != nil || driver != c.want):
			t.Errorf("%s on %v: %q, %v; want %q", c.espName, c.on, driver, err, c.want)
		case !c.ok && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s on %v: %q, %v; want an error with %q", c.espName, c.on, driver, err, c.want)
		}
	}
	if err := pickIs(after, "cbc(aes)", cbc); err != nil {
		t.Errorf("forced cbc(aes): %v", err)
	}
	if err := pickIs(before, "cbc(aes)", cbc); err == nil || !strings.Contains(err.Error(), "picks cbc-aes-aesni (priority 400)") {
		t.Errorf("cbc(aes) before forcing: %v", err)
	}
}

// TestMissingReason checks that a kernel without a generic driver's part
// gets a reason naming it.
func TestMissingReason(t *testing.T) {
	algs := parse(t, procCryptoAESNI)
	err := syscall.ENOENT
	if got := missingReason(algs, genericDrivers["rfc7539esp(chacha20,poly1305)"], err); !strings.Contains(got, "no chacha20-generic or poly1305-generic for rfc7539esp(chacha20-generic,poly1305-generic)") {
		t.Errorf("chacha20poly1305: %q", got)
	}
	if got := missingReason(algs, genericDrivers["rfc4106(gcm(aes))"], err); !strings.Contains(got, "no ghash-generic for") {
		t.Errorf("gcm: %q", got)
	}
	if got := missingReason(algs, genericDrivers["cbc(aes)"], err); !strings.Contains(got, "cannot build cbc(aes-generic) or cbc(ecb(aes-generic)) (a template missing?)") {
		t.Errorf("cbc: %q", got)
	}
}

// TestHeldRegistry checks the bookkeeping of what this process holds
// without a kernel: releasing what is not held does nothing, and a
// forced name held twice is undone by the second release only.
func TestHeldRegistry(t *testing.T) {
	if err := (Pcrypt{Name: "rfc4106(gcm(aes))", Driver: "pcrypt(x)"}).Release(); err != nil {
		t.Errorf("releasing a pcrypt instance not held: %v", err)
	}
	if err := (Generic{Name: "cbc(aes)", Driver: "cbc(aes-generic)"}).Release(); err != nil {
		t.Errorf("releasing a generic driver not held: %v", err)
	}
	const name = "test(not-a-kernel-name)"
	held.Lock()
	held.forced[name] = &forcing{driver: "test-generic", users: 2}
	held.Unlock()
	g := Generic{Name: name, Driver: "test-generic"}
	if err := g.Release(); err != nil {
		t.Fatal(err)
	}
	held.Lock()
	f := held.forced[name]
	held.Unlock()
	if f == nil || f.users != 1 {
		t.Fatalf("after one of two releases: %+v", f)
	}
	// The last release asks the kernel to restore the priority; without
	// crypto_user, or without the name, it fails or finds nothing, and
	// the name is no longer held either way.
	_ = g.Release()
	held.Lock()
	defer held.Unlock()
	if held.forced[name] != nil {
		t.Errorf("still held after the last release")
	}
}
