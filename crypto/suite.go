package crypto

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// EncryptionID is an IKEv2 transform type 1 (encryption algorithm) ID from
// the IANA "IKEv2 Parameters" registry.
type EncryptionID uint16

// Encryption transform IDs. Only EncrNull, EncrAESCBC, EncrAESGCM12,
// EncrAESGCM16, EncrNullAuthAESGMAC and EncrChaCha20Poly1305 are
// implemented; the others are named so that errors can name them.
const (
	Encr3DES             EncryptionID = 3  // ENCR_3DES
	EncrNull             EncryptionID = 11 // ENCR_NULL, RFC 2410
	EncrAESCBC           EncryptionID = 12 // ENCR_AES_CBC, RFC 3602
	EncrAESCTR           EncryptionID = 13 // ENCR_AES_CTR, RFC 3686
	EncrAESCCM8          EncryptionID = 14 // ENCR_AES_CCM_8, RFC 4309
	EncrAESCCM12         EncryptionID = 15 // ENCR_AES_CCM_12
	EncrAESCCM16         EncryptionID = 16 // ENCR_AES_CCM_16
	EncrAESGCM8          EncryptionID = 18 // ENCR_AES_GCM_8, RFC 4106
	EncrAESGCM12         EncryptionID = 19 // ENCR_AES_GCM_12
	EncrAESGCM16         EncryptionID = 20 // ENCR_AES_GCM_16
	EncrNullAuthAESGMAC  EncryptionID = 21 // ENCR_NULL_AUTH_AES_GMAC, RFC 4543
	EncrCamelliaCBC      EncryptionID = 23 // ENCR_CAMELLIA_CBC, RFC 5529
	EncrChaCha20Poly1305 EncryptionID = 28 // ENCR_CHACHA20_POLY1305, RFC 7634
)

var encryptionNames = map[EncryptionID]string{
	Encr3DES:             "ENCR_3DES",
	EncrNull:             "ENCR_NULL",
	EncrAESCBC:           "ENCR_AES_CBC",
	EncrAESCTR:           "ENCR_AES_CTR",
	EncrAESCCM8:          "ENCR_AES_CCM_8",
	EncrAESCCM12:         "ENCR_AES_CCM_12",
	EncrAESCCM16:         "ENCR_AES_CCM_16",
	EncrAESGCM8:          "ENCR_AES_GCM_8",
	EncrAESGCM12:         "ENCR_AES_GCM_12",
	EncrAESGCM16:         "ENCR_AES_GCM_16",
	EncrNullAuthAESGMAC:  "ENCR_NULL_AUTH_AES_GMAC",
	EncrCamelliaCBC:      "ENCR_CAMELLIA_CBC",
	EncrChaCha20Poly1305: "ENCR_CHACHA20_POLY1305",
}

// String returns the IANA name of the transform, such as "ENCR_AES_GCM_16",
// or "ENCR_<n>" for an ID this package does not name.
func (e EncryptionID) String() string {
	if s, ok := encryptionNames[e]; ok {
		return s
	}
	return "ENCR_" + strconv.Itoa(int(e))
}

// IntegrityID is an IKEv2 transform type 3 (integrity algorithm) ID from
// the IANA "IKEv2 Parameters" registry.
type IntegrityID uint16

// Integrity transform IDs. AuthNone, AuthHMACSHA196 and the three SHA-2
// variants are implemented; the others are named for error messages.
const (
	AuthNone           IntegrityID = 0  // NONE: AEAD suites
	AuthHMACMD596      IntegrityID = 1  // AUTH_HMAC_MD5_96, RFC 2403
	AuthHMACSHA196     IntegrityID = 2  // AUTH_HMAC_SHA1_96, RFC 2404
	AuthAESXCBC96      IntegrityID = 5  // AUTH_AES_XCBC_96, RFC 3566
	AuthHMACSHA2256128 IntegrityID = 12 // AUTH_HMAC_SHA2_256_128, RFC 4868
	AuthHMACSHA2384192 IntegrityID = 13 // AUTH_HMAC_SHA2_384_192, RFC 4868
	AuthHMACSHA2512256 IntegrityID = 14 // AUTH_HMAC_SHA2_512_256, RFC 4868
)

var integrityNames = map[IntegrityID]string{
	AuthNone:           "NONE",
	AuthHMACMD596:      "AUTH_HMAC_MD5_96",
	AuthHMACSHA196:     "AUTH_HMAC_SHA1_96",
	AuthAESXCBC96:      "AUTH_AES_XCBC_96",
	AuthHMACSHA2256128: "AUTH_HMAC_SHA2_256_128",
	AuthHMACSHA2384192: "AUTH_HMAC_SHA2_384_192",
	AuthHMACSHA2512256: "AUTH_HMAC_SHA2_512_256",
}

// String returns the IANA name of the transform, such as
// "AUTH_HMAC_SHA2_256_128", or "AUTH_<n>" for an ID this package does not
// name.
func (i IntegrityID) String() string {
	if s, ok := integrityNames[i]; ok {
		return s
	}
	return "AUTH_" + strconv.Itoa(int(i))
}

// Suite names the ESP algorithms of one SA.
type Suite struct {
	Encryption EncryptionID
	// KeyBits is the encryption key size without the salt: 128, 192 or 256
	// for AES, 256 for ChaCha20, 0 for NULL.
	KeyBits int
	// Integrity is AuthNone for the AEAD suites (GCM, GMAC, ChaCha20-Poly1305).
	Integrity IntegrityID
	// ESN enables 64-bit extended sequence numbers (RFC 4303 section 2.2.1).
	ESN bool
}

// saltLen is the salt that RFC 4106, 4543 and 7634 append to the key.
const saltLen = 4

// AEAD reports whether the suite is a combined-mode algorithm whose ICV
// comes from the cipher (AES-GCM, AES-GMAC, ChaCha20-Poly1305).
func (s Suite) AEAD() bool {
	switch s.Encryption {
	case EncrAESGCM8, EncrAESGCM12, EncrAESGCM16, EncrNullAuthAESGMAC,
		EncrChaCha20Poly1305, EncrAESCCM8, EncrAESCCM12, EncrAESCCM16:
		return true
	}
	return false
}

// EncKeyLen returns the bytes of encryption keying material the suite
// takes from the IKE key derivation, the 4-byte salt included for AES-GCM,
// AES-GMAC and ChaCha20-Poly1305 (RFC 4106 section 8.1, RFC 4543 section
// 6, RFC 7634 section 2). It is meaningful for valid suites only.
func (s Suite) EncKeyLen() int {
	switch s.Encryption {
	case EncrAESGCM12, EncrAESGCM16, EncrNullAuthAESGMAC, EncrChaCha20Poly1305:
		return s.KeyBits/8 + saltLen
	case EncrNull:
		return 0
	}
	return s.KeyBits / 8
}

// IntegKeyLen returns the bytes of integrity key the suite takes: 20 for
// HMAC-SHA1-96, 32, 48 and 64 for the SHA-2 variants (RFC 4868 uses keys
// as long as the hash output), 0 for AEAD suites.
func (s Suite) IntegKeyLen() int {
	switch s.Integrity {
	case AuthHMACSHA196:
		return 20
	case AuthHMACSHA2256128:
		return 32
	case AuthHMACSHA2384192:
		return 48
	case AuthHMACSHA2512256:
		return 64
	case AuthHMACMD596:
		return 16
	}
	return 0
}

// icvLen returns the ICV length of a valid suite.
func (s Suite) icvLen() int {
	switch s.Encryption {
	case EncrAESGCM12:
		return 12
	case EncrAESGCM16, EncrNullAuthAESGMAC, EncrChaCha20Poly1305:
		return 16
	}
	switch s.Integrity {
	case AuthHMACSHA196:
		return 12
	case AuthHMACSHA2256128:
		return 16
	case AuthHMACSHA2384192:
		return 24
	case AuthHMACSHA2512256:
		return 32
	}
	return 0
}

// Validate reports whether espd implements the suite, naming what it
// refuses.
func (s Suite) Validate() error {
	aesBits := func() error {
		switch s.KeyBits {
		case 128, 192, 256:
			return nil
		}
		return fmt.Errorf("crypto: %v takes a 128, 192 or 256-bit key, not %d bits", s.Encryption, s.KeyBits)
	}
	switch s.Encryption {
	case EncrAESGCM12, EncrAESGCM16, EncrNullAuthAESGMAC:
		if err := aesBits(); err != nil {
			return err
		}
	case EncrChaCha20Poly1305:
		if s.KeyBits != 256 {
			return fmt.Errorf("crypto: %v takes a 256-bit key, not %d bits", s.Encryption, s.KeyBits)
		}
	case EncrAESCBC:
		if err := aesBits(); err != nil {
			return err
		}
	case EncrNull:
		if s.KeyBits != 0 {
			return fmt.Errorf("crypto: %v takes no key, not %d bits", s.Encryption, s.KeyBits)
		}
	case EncrAESGCM8:
		return fmt.Errorf("crypto: %v is not supported: Go's AES-GCM (crypto/cipher) refuses tags shorter than 12 bytes", s.Encryption)
	default:
		return fmt.Errorf("crypto: encryption algorithm %v is not supported (espd implements AES-CBC, AES-GCM, AES-GMAC, ChaCha20-Poly1305 and NULL)", s.Encryption)
	}
	if s.AEAD() {
		if s.Integrity != AuthNone {
			return fmt.Errorf("crypto: %v is a combined-mode algorithm and takes no integrity algorithm, not %v", s.Encryption, s.Integrity)
		}
		return nil
	}
	switch s.Integrity {
	case AuthHMACSHA196, AuthHMACSHA2256128, AuthHMACSHA2384192, AuthHMACSHA2512256:
		return nil
	case AuthNone:
		return fmt.Errorf("crypto: %v needs an integrity algorithm: espd does not do ESP without integrity", s.Encryption)
	}
	return fmt.Errorf("crypto: integrity algorithm %v is not supported (espd implements HMAC-SHA1-96, HMAC-SHA2-256-128, -384-192 and -512-256)", s.Integrity)
}

// SuiteFromIDs builds a suite from the IKEv2 transform IDs a key exchange
// negotiated, as the control socket and the charon plugin pass them.
// keyBits is the Key Length attribute without the salt; 0 is accepted for
// ChaCha20-Poly1305 (which has no Key Length attribute) and means 256.
func SuiteFromIDs(enc EncryptionID, keyBits int, integ IntegrityID, esn bool) (Suite, error) {
	if enc == EncrChaCha20Poly1305 && keyBits == 0 {
		keyBits = 256
	}
	s := Suite{Encryption: enc, KeyBits: keyBits, Integrity: integ, ESN: esn}
	if err := s.Validate(); err != nil {
		return Suite{}, err
	}
	return s, nil
}

// String returns the canonical strongSwan proposal name of the suite, such
// as "aes128gcm16", "chacha20poly1305", "aes256-sha384", "aes128gmac" or
// "null-sha256", with "-esn" appended when ESN is on. ParseSuite accepts
// every name String returns for a valid suite.
func (s Suite) String() string {
	var b strings.Builder
	switch s.Encryption {
	case EncrAESGCM8, EncrAESGCM12, EncrAESGCM16:
		icv := map[EncryptionID]int{EncrAESGCM8: 8, EncrAESGCM12: 12, EncrAESGCM16: 16}[s.Encryption]
		fmt.Fprintf(&b, "aes%dgcm%d", s.KeyBits, icv)
	case EncrNullAuthAESGMAC:
		fmt.Fprintf(&b, "aes%dgmac", s.KeyBits)
	case EncrChaCha20Poly1305:
		b.WriteString("chacha20poly1305")
	case EncrAESCBC:
		fmt.Fprintf(&b, "aes%d", s.KeyBits)
	case EncrNull:
		b.WriteString("null")
	default:
		b.WriteString(strings.ToLower(s.Encryption.String()))
	}
	if !s.AEAD() || s.Integrity != AuthNone {
		b.WriteByte('-')
		switch s.Integrity {
		case AuthHMACSHA196:
			b.WriteString("sha1")
		case AuthHMACSHA2256128:
			b.WriteString("sha256")
		case AuthHMACSHA2384192:
			b.WriteString("sha384")
		case AuthHMACSHA2512256:
			b.WriteString("sha512")
		case AuthNone:
			b.WriteString("none")
		default:
			b.WriteString(strings.ToLower(s.Integrity.String()))
		}
	}
	if s.ESN {
		b.WriteString("-esn")
	}
	return b.String()
}

// encTokens maps the strongSwan ESP encryption keywords espd implements.
var encTokens = map[string]Suite{
	"null":             {Encryption: EncrNull},
	"aes":              {Encryption: EncrAESCBC, KeyBits: 128},
	"chacha20poly1305": {Encryption: EncrChaCha20Poly1305, KeyBits: 256},
}

// integTokens maps the strongSwan integrity keywords espd implements.
var integTokens = map[string]IntegrityID{
	"sha":      AuthHMACSHA196,
	"sha1":     AuthHMACSHA196,
	"sha256":   AuthHMACSHA2256128,
	"sha2_256": AuthHMACSHA2256128,
	"sha384":   AuthHMACSHA2384192,
	"sha2_384": AuthHMACSHA2384192,
	"sha512":   AuthHMACSHA2512256,
	"sha2_512": AuthHMACSHA2512256,
}

func init() {
	for _, bits := range []int{128, 192, 256} {
		p := "aes" + strconv.Itoa(bits)
		encTokens[p] = Suite{Encryption: EncrAESCBC, KeyBits: bits}
		for _, icv := range []string{"gcm16", "gcm128", "gcm"} {
			encTokens[p+icv] = Suite{Encryption: EncrAESGCM16, KeyBits: bits}
		}
		for _, icv := range []string{"gcm12", "gcm96"} {
			encTokens[p+icv] = Suite{Encryption: EncrAESGCM12, KeyBits: bits}
		}
		encTokens[p+"gmac"] = Suite{Encryption: EncrNullAuthAESGMAC, KeyBits: bits}
	}
}

// ParseSuite parses one ESP proposal in strongSwan syntax: algorithm
// keywords joined by '-', such as "aes128gcm16", "aes256-sha384-esn",
// "chacha20poly1305-noesn" or "aes128-sha256-modp3072". It takes exactly
// one encryption algorithm, an integrity algorithm unless the encryption
// is combined-mode, and optionally "esn" or "noesn" (the default).
// Key-exchange groups (modp*, ecp*, curve25519, x448, mlkem*, ke1_*, ...)
// are accepted and ignored: they do not change the ESP keys. Every other
// keyword is refused with an error that names it.
func ParseSuite(name string) (Suite, error) {
	if name == "" {
		return Suite{}, errors.New("crypto: empty ESP proposal")
	}
	var (
		s                Suite
		encTok, integTok string
		sawESN, sawNoESN bool
		integ            IntegrityID
		lowered          = strings.ToLower(name)
	)
	for _, tok := range strings.Split(lowered, "-") {
		if tok == "" {
			return Suite{}, fmt.Errorf("crypto: empty algorithm keyword in ESP proposal %q", name)
		}
		if e, ok := encTokens[tok]; ok {
			if encTok != "" {
				return Suite{}, fmt.Errorf("crypto: ESP proposal %q names two encryption algorithms, %q and %q: espd takes exactly one", name, encTok, tok)
			}
			encTok, s = tok, e
			continue
		}
		if i, ok := integTokens[tok]; ok {
			if integTok != "" {
				return Suite{}, fmt.Errorf("crypto: ESP proposal %q names two integrity algorithms, %q and %q: espd takes exactly one", name, integTok, tok)
			}
			integTok, integ = tok, i
			continue
		}
		switch {
		case tok == "esn":
			sawESN = true
			continue
		case tok == "noesn":
			sawNoESN = true
			continue
		case isKEToken(tok):
			continue
		}
		return Suite{}, fmt.Errorf("crypto: %s in ESP proposal %q", refusal(tok), name)
	}
	if encTok == "" {
		return Suite{}, fmt.Errorf("crypto: ESP proposal %q names no encryption algorithm", name)
	}
	if sawESN && sawNoESN {
		return Suite{}, fmt.Errorf("crypto: ESP proposal %q says both esn and noesn: espd needs one", name)
	}
	s.ESN = sawESN
	if s.AEAD() && integTok != "" {
		return Suite{}, fmt.Errorf("crypto: ESP proposal %q combines the combined-mode algorithm %q with the integrity algorithm %q", name, encTok, integTok)
	}
	if !s.AEAD() && integTok == "" {
		return Suite{}, fmt.Errorf("crypto: ESP proposal %q: %q needs an integrity algorithm (sha1, sha256, sha384 or sha512)", name, encTok)
	}
	s.Integrity = integ
	if err := s.Validate(); err != nil {
		return Suite{}, err
	}
	return s, nil
}

// refusal says why a keyword that is not implemented is refused.
func refusal(tok string) string {
	has := func(sub string) bool { return strings.Contains(tok, sub) }
	switch {
	case strings.HasPrefix(tok, "aes") && (strings.HasSuffix(tok, "gcm8") || strings.HasSuffix(tok, "gcm64")):
		return fmt.Sprintf("%q (AES-GCM with an 8-byte ICV) is not supported: Go's AES-GCM refuses tags shorter than 12 bytes", tok)
	case strings.HasPrefix(tok, "aes") && has("ccm"):
		return fmt.Sprintf("%q (AES-CCM) is not supported", tok)
	case strings.HasPrefix(tok, "aes") && has("ctr"):
		return fmt.Sprintf("%q (AES-CTR) is not supported", tok)
	case tok == "aesxcbc" || tok == "aescmac" || has("xcbc") || has("cmac"):
		return fmt.Sprintf("integrity algorithm %q is not supported", tok)
	case strings.HasPrefix(tok, "md5"):
		return fmt.Sprintf("integrity algorithm %q (MD5) is not supported", tok)
	case strings.HasPrefix(tok, "sha") && (strings.HasSuffix(tok, "_96") || strings.HasSuffix(tok, "_160") || strings.HasSuffix(tok, "_128") || strings.HasSuffix(tok, "_192") || strings.HasSuffix(tok, "_256")):
		return fmt.Sprintf("integrity algorithm %q (a non-standard truncation) is not supported", tok)
	case strings.HasPrefix(tok, "prf"):
		return fmt.Sprintf("%q is an IKE PRF, not an ESP algorithm", tok)
	case tok == "3des" || tok == "des" || tok == "cast128" || tok == "blowfish" ||
		strings.HasPrefix(tok, "blowfish") || strings.HasPrefix(tok, "camellia") ||
		strings.HasPrefix(tok, "serpent") || strings.HasPrefix(tok, "twofish") || tok == "idea" ||
		strings.HasPrefix(tok, "aes"):
		return fmt.Sprintf("encryption algorithm %q is not supported (espd implements aes, aesNNNgcm16/12, aesNNNgmac, chacha20poly1305 and null)", tok)
	}
	return fmt.Sprintf("unknown or unsupported algorithm %q", tok)
}

// isKEToken reports whether tok names a strongSwan key exchange method,
// which an ESP proposal may carry for PFS but which does not change the
// ESP keys handed to espd.
func isKEToken(tok string) bool {
	if len(tok) > 4 && tok[:2] == "ke" && tok[2] >= '1' && tok[2] <= '7' && tok[3] == '_' {
		rest := tok[4:]
		return rest == "none" || isKEToken(rest)
	}
	switch tok {
	case "curve25519", "x25519", "curve448", "x448", "modpnone":
		return true
	}
	digitsThen := func(rest string, suffixes ...string) bool {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 {
			return false
		}
		for _, sfx := range suffixes {
			if rest[i:] == sfx {
				return true
			}
		}
		return false
	}
	switch {
	case strings.HasPrefix(tok, "modp"):
		// modp2048, modp1024s160, modp2048s224, modp2048s256
		return digitsThen(tok[4:], "", "s160", "s224", "s256")
	case strings.HasPrefix(tok, "ecp"):
		// ecp256, ecp384bp
		return digitsThen(tok[3:], "", "bp")
	case strings.HasPrefix(tok, "mlkem"):
		return digitsThen(tok[5:], "")
	}
	return false
}
