package sa

import (
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
)

// Config is everything AddSA and UpdateSA carry about a state. Its
// formatting (String and every fmt verb) never shows the keys.
type Config struct {
	SPI uint32
	Dir Direction // DirIn or DirOut
	// Src and Dst are the outer (tunnel) endpoints, both IPv4 or both
	// IPv6. (SPI, Dst) identifies the state.
	Src, Dst netip.Addr
	// Mode is tunnel (the zero value) or transport. A transport-mode
	// state carries only the packets of Src and Dst themselves (the data
	// plane refuses others); UpdateSA cannot change it.
	Mode  Mode
	Suite crypto.Suite
	// EncKey (Suite.EncKeyLen bytes, salt included) and IntegKey
	// (Suite.IntegKeyLen bytes). AddSA copies them; SA.Config returns them
	// nil; UpdateSA accepts nil for "unchanged".
	EncKey, IntegKey []byte
	// ReplayWindow is the inbound anti-replay window in packets, at most
	// esp.MaxReplayWindow (rounded up to a multiple of 64); 0 turns replay
	// checking off. DefaultConfig sets DefaultReplayWindow: a zero here is
	// taken as the caller's explicit choice.
	ReplayWindow uint32
	// EncapSrcPort and EncapDstPort put ESP in UDP (RFC 3948); both 0
	// means raw ESP.
	EncapSrcPort, EncapDstPort uint16
	ReqID                      uint32
	// IfID is XFRM's if_id: an inbound state's packets, once decrypted,
	// leave through the route-based interface with this ID, and an
	// outbound state serves only the policies of this ID (Policy.IfID).
	// 0: espd's policy-based TUN. UpdateSA cannot change it.
	IfID uint32
	// Selectors are the inner traffic the state may carry, as seen in the
	// state's direction (for an inbound state Src is the remote network);
	// empty means any.
	Selectors []Selector
	Soft      Lifetime
	Hard      Lifetime
	// Outer header options (outbound): TTL (0: DefaultTTL), DSCP copied
	// from the inner packet or set to DSCP, RFC 6040 ECN (inbound too),
	// the IPv4 DF bit, and TFC padding of short inner packets up to
	// TFCPadTo bytes. DefaultConfig holds their defaults (defaults.go).
	TTL      uint8
	CopyDSCP bool
	DSCP     uint8
	ECN      bool
	DF       esp.DFMode
	TFCPadTo int

	// OSeq (XFRM's oseq; outbound states only) is the last sequence
	// number taken as sent: the state's first packet gets OSeq+1, or a
	// higher number, never a lower one. It is a floor, the same on every
	// keying path: the state sends above the highest of OSeq, the
	// SeqStore's record of its key, and the last number of a state it
	// replaces under the same key. It must leave the state one number to
	// send: below 2^32-1, or 2^64-1 with ESN. On an update a higher OSeq
	// raises the state's counter (the next packet gets OSeq+1) and a
	// lower one changes nothing. 0: no floor. SA.Config returns it 0:
	// Stats().SeqOut is the number actually last sent.
	OSeq uint64
	// ReplaySeq (XFRM's replay-seq; inbound states only) is the highest
	// sequence number the state is to take as already received (at most
	// 2^32-1 without ESN), and ReplayBitmap which numbers below it were
	// (esp.ReplayWindow.Bitmap's layout: bit i, byte i/8 value 1<<(i%8),
	// is set when ReplaySeq-i was seen; numbers the bitmap does not
	// cover count as seen, so ReplaySeq alone refuses everything up to
	// it). The bitmap holds at most the replay window's size in bits
	// (ReplayWindow rounded up to a multiple of 64) and no bit for a
	// number below 1; it needs ReplaySeq. The state's window becomes the
	// union of what it already refuses (a state replaced under the same
	// key, or the state's own window on an update) and this: the higher
	// top, and every number refused by either stays refused. 0 and nil:
	// nothing to add (a new state's window starts empty). SA.Config
	// returns them unset: SA.ReplayTop and SA.ReplayBitmap read the
	// window.
	ReplaySeq    uint64
	ReplayBitmap []byte

	// Negotiated says that the keys were negotiated by an IKE daemon for
	// this state alone and are never installed again once it is gone, so
	// the SeqStore may forget them after its retention (seqstore's
	// Options.Retain). False, the default on every keying path, means
	// manual keying: the record of the key's sequence numbers is kept for
	// ever, because a manual key may be added again at any time. Only the
	// control protocol sets it (charon's plugin does, on every state it
	// installs); espctl and the configuration file never do. It cannot
	// change: UpdateSA refuses a different value, and a state that
	// continues a removed negotiated state of the same key must be
	// negotiated too.
	Negotiated bool
}

// Names of the sequence-number settings, as FieldError.Field gives them
// (XFRM's words; espctl's flags and the configuration file's keys).
const (
	FieldOSeq         = "oseq"
	FieldReplaySeq    = "replay-seq"
	FieldReplayBitmap = "replay-bitmap"
	// FieldNegotiated is Config.Negotiated, which has no espctl flag or
	// configuration file key: only the control protocol sets it.
	FieldNegotiated = "negotiated"
)

// Names of the settings UpdateSA cannot change, as FieldError.Field gives
// them: Config.Suite (its ESN alone: FieldESN), the keys, ReqID and, for
// an inbound state, ReplayWindow.
const (
	FieldSuite        = "suite"
	FieldESN          = "esn"
	FieldKeys         = "keys"
	FieldReqID        = "reqid"
	FieldIfID         = "if-id"
	FieldReplayWindow = "replay-window"
)

// FieldError is what Validate (and so AddSA, UpdateSA and Apply) returns
// for an unusable sequence-number setting, AddSA, UpdateSA and Apply for
// a key origin that cannot change, and UpdateSA and Apply for any other
// setting an update cannot change: Field names it (FieldOSeq,
// FieldReplaySeq, FieldReplayBitmap, FieldNegotiated, FieldSuite,
// FieldESN, FieldKeys, FieldReqID, FieldIfID or FieldReplayWindow), so that a front
// end can point at its own spelling of it.
type FieldError struct {
	Field string
	Err   error
}

// Error returns the message of Err, which names the state and the field.
func (e *FieldError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

// immutable returns a *FieldError for field, classed ErrImmutable.
func immutable(field, format string, args ...any) error {
	return &FieldError{Field: field, Err: kindErrorf(ErrImmutable, format, args...)}
}

// fieldErrorf returns a *FieldError for field with a formatted message.
func fieldErrorf(field, format string, args ...any) error {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}

// seqMaxOf returns the last sequence number a state of suite s can use.
func seqMaxOf(s crypto.Suite) uint64 {
	if s.ESN {
		return 1<<64 - 1
	}
	return 1<<32 - 1
}

// validateSeq checks the sequence-number settings (OSeq, ReplaySeq,
// ReplayBitmap) of a configuration whose direction and suite are valid.
func (c *Config) validateSeq() error {
	if c.OSeq != 0 && c.Dir != DirOut {
		return fieldErrorf(FieldOSeq, "sa: state spi 0x%08x: oseq is the outbound sequence number; an inbound state takes replay-seq and replay-bitmap", c.SPI)
	}
	if (c.ReplaySeq != 0 || len(c.ReplayBitmap) != 0) && c.Dir != DirIn {
		f := FieldReplaySeq
		if c.ReplaySeq == 0 {
			f = FieldReplayBitmap
		}
		return fieldErrorf(f, "sa: state spi 0x%08x: %s is inbound replay state; an outbound state takes oseq", c.SPI, f)
	}
	if m := seqMaxOf(c.Suite); c.OSeq >= m {
		hint := ""
		if !c.Suite.ESN {
			hint = " (without ESN sequence numbers end at 2^32-1)"
		}
		return fieldErrorf(FieldOSeq, "sa: state spi 0x%08x: oseq %d leaves no sequence number to send: %v numbers up to %d%s", c.SPI, c.OSeq, c.Suite, m, hint)
	}
	if !c.Suite.ESN && c.ReplaySeq > 1<<32-1 {
		return fieldErrorf(FieldReplaySeq, "sa: state spi 0x%08x: replay-seq %d is above 2^32-1, which is as far as %v numbers; use ESN", c.SPI, c.ReplaySeq, c.Suite)
	}
	if len(c.ReplayBitmap) == 0 {
		return nil
	}
	if c.ReplaySeq == 0 {
		return fieldErrorf(FieldReplayBitmap, "sa: state spi 0x%08x: replay-bitmap needs replay-seq, the number its bit 0 stands for", c.SPI)
	}
	w := (uint64(min(c.ReplayWindow, esp.MaxReplayWindow)) + 63) &^ 63
	if uint64(len(c.ReplayBitmap))*8 > w {
		return fieldErrorf(FieldReplayBitmap, "sa: state spi 0x%08x: replay-bitmap of %d bytes is longer than the replay window of %d packets (%d bytes)", c.SPI, len(c.ReplayBitmap), w, w/8)
	}
	for i := range uint64(len(c.ReplayBitmap)) * 8 {
		if i >= c.ReplaySeq && c.ReplayBitmap[i/8]&(1<<(i%8)) != 0 {
			return fieldErrorf(FieldReplayBitmap, "sa: state spi 0x%08x: replay-bitmap bit %d stands for number %d-%d, below 1", c.SPI, i, c.ReplaySeq, i)
		}
	}
	return nil
}

// allZero reports whether k is non-empty and all zero bytes: a key no
// keying path accepts (a suite without a separate integrity key has none).
func allZero(k []byte) bool {
	var or byte
	for _, b := range k {
		or |= b
	}
	return len(k) > 0 && or == 0
}

// maxTFCPadTo bounds TFCPadTo: no inner packet is longer.
const maxTFCPadTo = 65535

// Validate reports what makes c unusable as a state (what AddSA would
// refuse), never quoting a key. It is the one place where a state's
// configuration is checked: the control socket, espctl (through it) and the
// configuration file all get its errors.
func (c Config) Validate() error { return c.validate(false) }

// validate reports what makes c unusable as a state, never quoting a key.
// With update, nil keys are accepted (unchanged).
func (c *Config) validate(update bool) error { return classed(ErrInvalid, c.check(update)) }

// check is validate's checks, unclassed.
func (c *Config) check(update bool) error {
	if c.Dir != DirIn && c.Dir != DirOut {
		return fmt.Errorf("sa: state direction must be in or out, not %v", c.Dir)
	}
	if c.SPI < minSPI {
		return fmt.Errorf("sa: SPI %d is reserved: RFC 4303 section 2.1 reserves 0-255; use 256 (0x100) or above", c.SPI)
	}
	if c.ReplayWindow > esp.MaxReplayWindow {
		return fmt.Errorf("sa: state spi 0x%08x: replay window %d is above the maximum of %d packets", c.SPI, c.ReplayWindow, esp.MaxReplayWindow)
	}
	if !c.Src.IsValid() || !c.Dst.IsValid() {
		return fmt.Errorf("sa: state spi 0x%08x needs outer src and dst addresses", c.SPI)
	}
	if c.Src.Zone() != "" || c.Dst.Zone() != "" {
		return fmt.Errorf("sa: state spi 0x%08x: outer addresses must not carry a zone", c.SPI)
	}
	if c.Src.Unmap().Is4() != c.Dst.Unmap().Is4() {
		return fmt.Errorf("sa: state spi 0x%08x mixes address families (src %v, dst %v)", c.SPI, c.Src, c.Dst)
	}
	if err := c.Suite.Validate(); err != nil {
		return fmt.Errorf("sa: state spi 0x%08x: %w", c.SPI, err)
	}
	if !update || c.EncKey != nil || c.IntegKey != nil {
		if len(c.EncKey) != c.Suite.EncKeyLen() {
			return fmt.Errorf("sa: state spi 0x%08x: %v needs %d bytes of encryption key, got %d", c.SPI, c.Suite, c.Suite.EncKeyLen(), len(c.EncKey))
		}
		if len(c.IntegKey) != c.Suite.IntegKeyLen() {
			return fmt.Errorf("sa: state spi 0x%08x: %v needs %d bytes of integrity key, got %d", c.SPI, c.Suite, c.Suite.IntegKeyLen(), len(c.IntegKey))
		}
		if allZero(c.EncKey) || allZero(c.IntegKey) {
			return fmt.Errorf("sa: state spi 0x%08x: a key of all zeros is not a secret; generate one (head -c N /dev/urandom | od -An -tx1)", c.SPI)
		}
	}
	if (c.EncapSrcPort == 0) != (c.EncapDstPort == 0) {
		return fmt.Errorf("sa: state spi 0x%08x: UDP encapsulation needs both ports (got %d and %d)", c.SPI, c.EncapSrcPort, c.EncapDstPort)
	}
	if c.DSCP > 63 {
		return fmt.Errorf("sa: state spi 0x%08x: DSCP %d is above 63", c.SPI, c.DSCP)
	}
	if c.DF > esp.DFClear {
		return fmt.Errorf("sa: state spi 0x%08x: unknown DF mode %d", c.SPI, c.DF)
	}
	if err := c.checkMode(); err != nil {
		return err
	}
	if c.TFCPadTo < 0 || c.TFCPadTo > maxTFCPadTo {
		return fmt.Errorf("sa: state spi 0x%08x: TFC padding to %d bytes is out of range 0-%d", c.SPI, c.TFCPadTo, maxTFCPadTo)
	}
	for i, s := range c.Selectors {
		if err := s.Validate(); err != nil {
			return fmt.Errorf("sa: state spi 0x%08x selector %d: %w", c.SPI, i, err)
		}
	}
	return c.validateSeq()
}

// checkMode checks the mode, and that a transport-mode state asks for no
// TFC padding: transport mode carries no inner length that would tell the
// receiver where a TCP segment ends (RFC 4303 section 2.4).
func (c *Config) checkMode() error {
	switch {
	case c.Mode >= numModes:
		return fmt.Errorf("sa: state spi 0x%08x: unknown mode %v", c.SPI, c.Mode)
	case c.Mode == ModeTransport && c.TFCPadTo != 0:
		return fmt.Errorf("sa: state spi 0x%08x: transport mode takes no TFC padding (tfc %d): its packets carry no inner length to pad behind", c.SPI, c.TFCPadTo)
	}
	return nil
}

// public returns a copy of c without keys and sequence-number settings
// (applied once, not parameters), its addresses unmapped and its
// selectors normalized in a slice of its own.
func (c Config) public() Config {
	c.EncKey, c.IntegKey = nil, nil
	c.OSeq, c.ReplaySeq, c.ReplayBitmap = 0, 0, nil
	c.Src, c.Dst = c.Src.Unmap(), c.Dst.Unmap()
	sels := make([]Selector, len(c.Selectors))
	for i, s := range c.Selectors {
		sels[i] = s.normalized()
	}
	c.Selectors = sels
	return c
}

// outer returns the outer header options of c.
func (c *Config) outer() esp.Outer {
	return esp.Outer{
		Src: c.Src, Dst: c.Dst,
		SrcPort: c.EncapSrcPort, DstPort: c.EncapDstPort,
		TTL: c.TTL, CopyDSCP: c.CopyDSCP, DSCP: c.DSCP, ECN: c.ECN, DF: c.DF,
	}
}

// String describes the state without its keys, in the style of
// ip-xfrm(8): "spi 0x0000c001 dir out src ... dst ... aes128gcm16 reqid 1".
func (c Config) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "spi 0x%08x dir %v src %v dst %v %v", c.SPI, c.Dir, c.Src, c.Dst, c.Suite)
	if c.Mode != ModeTunnel {
		fmt.Fprintf(&b, " mode %v", c.Mode)
	}
	if c.EncKey != nil || c.IntegKey != nil {
		b.WriteString(" keys [redacted]")
	}
	if c.ReqID != 0 {
		fmt.Fprintf(&b, " reqid %d", c.ReqID)
	}
	if c.IfID != 0 {
		fmt.Fprintf(&b, " if_id %d", c.IfID)
	}
	if c.Dir == DirIn {
		fmt.Fprintf(&b, " replay-window %d", c.ReplayWindow)
	}
	if c.EncapDstPort != 0 {
		fmt.Fprintf(&b, " encap udp %d->%d", c.EncapSrcPort, c.EncapDstPort)
	}
	for _, s := range c.Selectors {
		fmt.Fprintf(&b, " sel [%v]", s)
	}
	if c.Soft != (Lifetime{}) {
		fmt.Fprintf(&b, " soft %+v", c.Soft)
	}
	if c.Hard != (Lifetime{}) {
		fmt.Fprintf(&b, " hard %+v", c.Hard)
	}
	if c.Dir == DirOut {
		if c.TTL != 0 {
			fmt.Fprintf(&b, " ttl %d", c.TTL)
		}
		if c.CopyDSCP {
			b.WriteString(" dscp copy")
		} else if c.DSCP != 0 {
			fmt.Fprintf(&b, " dscp %d", c.DSCP)
		}
		fmt.Fprintf(&b, " df %v", c.DF)
		if c.TFCPadTo != 0 {
			fmt.Fprintf(&b, " tfc %d", c.TFCPadTo)
		}
	}
	if c.ECN {
		b.WriteString(" ecn")
	}
	if c.OSeq != 0 {
		fmt.Fprintf(&b, " oseq %d", c.OSeq)
	}
	if c.ReplaySeq != 0 {
		fmt.Fprintf(&b, " replay-seq %d", c.ReplaySeq)
	}
	if c.Negotiated {
		b.WriteString(" negotiated")
	}
	if len(c.ReplayBitmap) != 0 {
		fmt.Fprintf(&b, " replay-bitmap %x", c.ReplayBitmap)
	}
	return b.String()
}

// Format makes every fmt verb (%v, %+v, %#v, %x, %d, ...) print String,
// so that no formatting of a Config can show its keys.
func (c Config) Format(f fmt.State, _ rune) { io.WriteString(f, c.String()) }

// onOff is "on" or "off".
func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// origin names a state's key origin (Config.Negotiated) in messages.
func origin(negotiated bool) string {
	if negotiated {
		return "negotiated"
	}
	return "manual"
}
