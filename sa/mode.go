package sa

import "fmt"

// Mode is a state's or a policy template's IPsec mode, as XFRM's: tunnel
// mode carries whole IP packets between two gateways inside an outer
// header; transport mode protects what follows the IP header of the two
// endpoints' own packets (RFC 4303 section 3.1.1). The zero value is
// tunnel mode, the default on every keying path.
type Mode uint8

// Modes.
const (
	ModeTunnel Mode = iota
	ModeTransport
	numModes
)

var modeNames = [...]string{ModeTunnel: "tunnel", ModeTransport: "transport"}

// String returns "tunnel" or "transport".
func (m Mode) String() string {
	if m < numModes {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode parses "tunnel" or "transport".
func ParseMode(s string) (Mode, error) {
	for m, n := range modeNames {
		if n == s {
			return Mode(m), nil
		}
	}
	return 0, fmt.Errorf("sa: unknown mode %q (want tunnel or transport)", s)
}

// FieldMode is Config.Mode, as FieldError.Field gives it: UpdateSA cannot
// change it.
const FieldMode = "mode"
