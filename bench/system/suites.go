package system

import (
	"fmt"
	"strings"

	"github.com/espd/espd/bench/xfrm"
	"github.com/espd/espd/crypto"
)

// RefusedByEspd is the reason espd's rows give for a suite espd's crypto
// refuses (3DES, Camellia: RFC 8221 deprecates or does not list them).
const RefusedByEspd = "refused by espd (RFC 8221)"

// kernelOnlyCiphers are the CBC ciphers users compared the kernel with
// that espd refuses: the harness names them itself, keys XFRM with them,
// and reports espd's rows as RefusedByEspd. Keyed by strongSwan's keyword.
var kernelOnlyCiphers = map[string]crypto.Suite{
	"3des":        {Encryption: crypto.Encr3DES, KeyBits: 192},
	"camellia":    {Encryption: crypto.EncrCamelliaCBC, KeyBits: 128},
	"camellia128": {Encryption: crypto.EncrCamelliaCBC, KeyBits: 128},
	"camellia192": {Encryption: crypto.EncrCamelliaCBC, KeyBits: 192},
	"camellia256": {Encryption: crypto.EncrCamelliaCBC, KeyBits: 256},
}

// ParseSuite parses a strongSwan ESP proposal: one espd implements
// (crypto.ParseSuite), or a kernel-only CBC cipher (3des, camellia128,
// camellia192, camellia256) with one HMAC, such as 3des-sha1 or
// camellia128-sha256.
func ParseSuite(name string) (crypto.Suite, error) {
	s, err := crypto.ParseSuite(name)
	if err == nil {
		return s, nil
	}
	enc, integ, ok := strings.Cut(strings.ToLower(name), "-")
	base, known := kernelOnlyCiphers[enc]
	if !known {
		return crypto.Suite{}, err
	}
	if !ok || integ == "" || strings.Contains(integ, "-") {
		return crypto.Suite{}, fmt.Errorf("ESP proposal %q: %s takes exactly one integrity algorithm, such as %s-sha256", name, enc, enc)
	}
	// The integrity keyword as crypto parses it beside AES-CBC.
	withAES, ierr := crypto.ParseSuite("aes128-" + integ)
	if ierr != nil {
		return crypto.Suite{}, fmt.Errorf("ESP proposal %q: %v", name, ierr)
	}
	base.Integrity = withAES.Integrity
	return base, nil
}

// SuiteName is a suite's strongSwan name, also for the kernel-only
// ciphers crypto does not name ("3des-sha1", "camellia128-sha256").
func SuiteName(s crypto.Suite) string { return xfrm.SuiteName(s) }

// refusedByEspd returns an *UnavailableError saying RefusedByEspd when
// espd's crypto refuses s, and nil when espd implements it.
func refusedByEspd(s crypto.Suite) error {
	if s.Validate() != nil {
		return &UnavailableError{Reason: RefusedByEspd}
	}
	return nil
}
