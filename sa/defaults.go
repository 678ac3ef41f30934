package sa

import "github.com/espd/espd/esp"

// Per-state defaults. They are defined here once, and every way of adding a
// state applies them to what it is not told: the control protocol (an
// attribute absent from SA_ADD), espctl (a flag not given: espctl sends no
// attribute and the daemon applies the default) and the configuration file
// (a key absent). DefaultConfig returns them as a Config.
const (
	// DefaultReplayWindow is the anti-replay window, in packets, of an
	// inbound state that does not set one (docs/safety.md, "Secure defaults,
	// the same on every path", says why 128). It can be raised up to
	// esp.MaxReplayWindow; an explicit 0 turns anti-replay checking off
	// and is never a default.
	DefaultReplayWindow = 128

	// DefaultECN is RFC 6040 normal-mode ECN: the outer header of an
	// outbound packet copies the inner ECN field, CE included, and a CE
	// mark on an inbound packet's outer header is carried to the inner
	// one (a CE outer over a Not-ECT inner is dropped). The kernel's XFRM does this unless a state has
	// XFRM_STATE_NOECN, and strongSwan's copy_ecn defaults to yes.
	DefaultECN = true

	// DefaultCopyDSCP copies the inner packet's DSCP to the outer header,
	// as XFRM does unless XFRM_SA_XFLAG_DONT_ENCAP_DSCP is set (strongSwan's
	// copy_dscp = out, its default).
	DefaultCopyDSCP = true

	// DefaultDF copies the IPv4 Don't Fragment bit from the inner packet,
	// as XFRM does unless XFRM_STATE_NOPMTUDISC is set (strongSwan's
	// copy_df = yes, its default).
	DefaultDF = esp.DFCopy

	// DefaultTTL is the outer TTL or hop limit of a state that does not set
	// one; a TTL of 0 in a Config means DefaultTTL.
	DefaultTTL = 64
)

// DefaultConfig returns a Config holding every per-state default and
// nothing else: start from it, then set the state's identity, algorithms,
// keys and whatever the caller was told.
//
//	field         default
//	ReplayWindow  DefaultReplayWindow (128; inbound states only)
//	ECN           on (RFC 6040 normal mode)
//	CopyDSCP      on (DSCP copied from the inner packet)
//	DF            esp.DFCopy (IPv4 outer DF copied from the inner packet)
//	TTL           0, which means DefaultTTL (64)
//	TFCPadTo      0 (no TFC padding)
//	Encap ports   0 0 (raw ESP)
//	ReqID         0
//	Selectors     none (any inner traffic)
//	Soft, Hard    no limits
//	Suite.ESN     off
func DefaultConfig() Config {
	return Config{
		ReplayWindow: DefaultReplayWindow,
		ECN:          DefaultECN,
		CopyDSCP:     DefaultCopyDSCP,
		DF:           DefaultDF,
	}
}
