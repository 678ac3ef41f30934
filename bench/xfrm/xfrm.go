// Package xfrm configures the Linux kernel's own IPsec (XFRM states and
// policies) over netlink for the benchmark harness, with the same suite and
// keys espd gets, so that the kernel's ESP can be measured beside espd's.
//
// A kernel built without ESP (CONFIG_INET_ESP unset) or without an
// algorithm refuses the state; Install then returns an *UnavailableError
// that names the reason the kernel gave, and the harness reports the row as
// unavailable instead of failing.
package xfrm

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// MaxReplayWindow is the largest replay window of a state without
// extended sequence numbers (the kernel's legacy 32-bit bitmap).
const MaxReplayWindow = 32

// Algorithms returns the kernel crypto API names and parameters of a suite
// with its keys: an AEAD, or a cipher with an integrity algorithm.
//
// Besides the suites espd implements (crypto.Suite.Validate), it takes the
// CBC ciphers only the kernel does here: 3DES (cbc(des3_ede), a 192-bit
// key) and Camellia (cbc(camellia), 128, 192 or 256 bits), each with an
// HMAC.
func Algorithms(s crypto.Suite, encKey, integKey []byte) (aead, crypt, auth *netlink.XfrmStateAlgo, err error) {
	if err := kernelOnly(s); err != nil {
		return nil, nil, nil, err
	}
	if len(encKey) != s.EncKeyLen() || len(integKey) != s.IntegKeyLen() {
		return nil, nil, nil, fmt.Errorf("xfrm: %v needs %d+%d key bytes, got %d+%d",
			s, s.EncKeyLen(), s.IntegKeyLen(), len(encKey), len(integKey))
	}
	key := func(b []byte) []byte { return append([]byte(nil), b...) }
	switch s.Encryption {
	case crypto.EncrAESGCM16, crypto.EncrAESGCM12, crypto.EncrAESGCM8:
		icv := map[crypto.EncryptionID]int{crypto.EncrAESGCM16: 128, crypto.EncrAESGCM12: 96, crypto.EncrAESGCM8: 64}[s.Encryption]
		aead = &netlink.XfrmStateAlgo{Name: "rfc4106(gcm(aes))", Key: key(encKey), ICVLen: icv}
	case crypto.EncrChaCha20Poly1305:
		aead = &netlink.XfrmStateAlgo{Name: "rfc7539esp(chacha20,poly1305)", Key: key(encKey), ICVLen: 128}
	case crypto.EncrNullAuthAESGMAC:
		aead = &netlink.XfrmStateAlgo{Name: "rfc4543(gcm(aes))", Key: key(encKey), ICVLen: 128}
	case crypto.EncrAESCBC:
		crypt = &netlink.XfrmStateAlgo{Name: "cbc(aes)", Key: key(encKey)}
	case crypto.EncrNull:
		crypt = &netlink.XfrmStateAlgo{Name: "ecb(cipher_null)", Key: []byte{}}
	case crypto.Encr3DES:
		crypt = &netlink.XfrmStateAlgo{Name: "cbc(des3_ede)", Key: key(encKey)}
	case crypto.EncrCamelliaCBC:
		crypt = &netlink.XfrmStateAlgo{Name: "cbc(camellia)", Key: key(encKey)}
	default:
		return nil, nil, nil, fmt.Errorf("xfrm: no kernel name for %v", s.Encryption)
	}
	if aead != nil {
		return aead, nil, nil, nil
	}
	names := map[crypto.IntegrityID]struct {
		name  string
		trunc int
	}{
		crypto.AuthHMACSHA196:     {"hmac(sha1)", 96},
		crypto.AuthHMACSHA2256128: {"hmac(sha256)", 128},
		crypto.AuthHMACSHA2384192: {"hmac(sha384)", 192},
		crypto.AuthHMACSHA2512256: {"hmac(sha512)", 256},
	}
	a, ok := names[s.Integrity]
	if !ok {
		return nil, nil, nil, fmt.Errorf("xfrm: no kernel name for %v", s.Integrity)
	}
	return nil, crypt, &netlink.XfrmStateAlgo{Name: a.name, Key: key(integKey), TruncateLen: a.trunc}, nil
}

// kernelOnly checks a suite: crypto's own check, or, for the kernel-only
// CBC ciphers, their key size and an HMAC.
func kernelOnly(s crypto.Suite) error {
	hmac := func() error {
		switch s.Integrity {
		case crypto.AuthHMACSHA196, crypto.AuthHMACSHA2256128, crypto.AuthHMACSHA2384192, crypto.AuthHMACSHA2512256:
			return nil
		}
		return fmt.Errorf("xfrm: %v needs an HMAC (sha1, sha256, sha384 or sha512), not %v", s.Encryption, s.Integrity)
	}
	switch s.Encryption {
	case crypto.Encr3DES:
		if s.KeyBits != 192 {
			return fmt.Errorf("xfrm: %v takes a 192-bit key, not %d bits", s.Encryption, s.KeyBits)
		}
		return hmac()
	case crypto.EncrCamelliaCBC:
		if s.KeyBits != 128 && s.KeyBits != 192 && s.KeyBits != 256 {
			return fmt.Errorf("xfrm: %v takes a 128, 192 or 256-bit key, not %d bits", s.Encryption, s.KeyBits)
		}
		return hmac()
	}
	return s.Validate()
}

// SuiteName is a suite's strongSwan name, also for the kernel-only CBC
// ciphers crypto does not name ("3des-sha1", "camellia128-sha256").
func SuiteName(s crypto.Suite) string {
	var enc string
	switch s.Encryption {
	case crypto.Encr3DES:
		enc = "3des"
	case crypto.EncrCamelliaCBC:
		enc = fmt.Sprintf("camellia%d", s.KeyBits)
	default:
		return s.String()
	}
	integ := crypto.Suite{Encryption: crypto.EncrAESCBC, KeyBits: 128, Integrity: s.Integrity}.String()
	_, tail, _ := strings.Cut(integ, "-")
	return enc + "-" + tail
}

// Tunnel is one gateway's side of a site-to-site ESP tunnel or, with
// Transport, one host's side of a transport-mode association with
// another host.
type Tunnel struct {
	Suite crypto.Suite
	// Transport makes the states and the policies' templates transport
	// mode, and leaves out the fwd policy: the hosts' own traffic, which
	// nothing forwards.
	Transport bool
	// Local and Remote are the outer addresses (the gateways), or the
	// hosts' own in transport mode.
	Local, Remote netip.Addr
	// LocalNet and RemoteNet are the protected inner networks: in
	// transport mode the selectors, normally Local and Remote alone.
	LocalNet, RemoteNet netip.Prefix
	// OutSPI protects Local -> Remote, InSPI Remote -> Local; each has
	// its keys.
	OutSPI, InSPI          uint32
	OutEncKey, OutIntegKey []byte
	InEncKey, InIntegKey   []byte
	ReqID                  int
	// ReplayWindow is the inbound state's window in packets (at most
	// MaxReplayWindow).
	ReplayWindow int
}

func ipOf(a netip.Addr) net.IP { return net.IP(a.AsSlice()) }

func ipNet(p netip.Prefix) *net.IPNet {
	p = p.Masked()
	return &net.IPNet{IP: ipOf(p.Addr()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// States returns the outbound and the inbound state.
func (t Tunnel) States() ([]*netlink.XfrmState, error) {
	if !t.Local.IsValid() || !t.Remote.IsValid() || t.Local.Is4() != t.Remote.Is4() {
		return nil, fmt.Errorf("xfrm: outer addresses %v and %v", t.Local, t.Remote)
	}
	if t.OutSPI == 0 || t.InSPI == 0 {
		return nil, errors.New("xfrm: SPI 0 is reserved")
	}
	if t.ReplayWindow < 0 || t.ReplayWindow > MaxReplayWindow {
		return nil, fmt.Errorf("xfrm: replay window %d out of 0..%d", t.ReplayWindow, MaxReplayWindow)
	}
	mk := func(src, dst netip.Addr, spi uint32, enc, integ []byte, window int) (*netlink.XfrmState, error) {
		aead, crypt, auth, err := Algorithms(t.Suite, enc, integ)
		if err != nil {
			return nil, err
		}
		return &netlink.XfrmState{
			Src: ipOf(src), Dst: ipOf(dst),
			Proto: netlink.XFRM_PROTO_ESP, Mode: t.mode(),
			Spi: int(spi), Reqid: t.ReqID, ReplayWindow: window,
			Aead: aead, Crypt: crypt, Auth: auth,
		}, nil
	}
	out, err := mk(t.Local, t.Remote, t.OutSPI, t.OutEncKey, t.OutIntegKey, 0)
	if err != nil {
		return nil, err
	}
	in, err := mk(t.Remote, t.Local, t.InSPI, t.InEncKey, t.InIntegKey, t.ReplayWindow)
	if err != nil {
		return nil, err
	}
	return []*netlink.XfrmState{out, in}, nil
}

// mode is the states' and templates' XFRM mode.
func (t Tunnel) mode() netlink.Mode {
	if t.Transport {
		return netlink.XFRM_MODE_TRANSPORT
	}
	return netlink.XFRM_MODE_TUNNEL
}

// Policies returns the policies of a forwarding gateway: out (local to
// remote network, through the outbound state), and in and fwd (remote to
// local network, through the inbound state; fwd is the one forwarded
// traffic is checked against). In transport mode there is no fwd policy:
// the host's own traffic is not forwarded.
func (t Tunnel) Policies() []*netlink.XfrmPolicy {
	tmpl := func(src, dst netip.Addr) []netlink.XfrmPolicyTmpl {
		return []netlink.XfrmPolicyTmpl{{
			Src: ipOf(src), Dst: ipOf(dst),
			Proto: netlink.XFRM_PROTO_ESP, Mode: t.mode(), Reqid: t.ReqID,
		}}
	}
	ps := []*netlink.XfrmPolicy{
		{Src: ipNet(t.LocalNet), Dst: ipNet(t.RemoteNet), Dir: netlink.XFRM_DIR_OUT, Tmpls: tmpl(t.Local, t.Remote)},
		{Src: ipNet(t.RemoteNet), Dst: ipNet(t.LocalNet), Dir: netlink.XFRM_DIR_IN, Tmpls: tmpl(t.Remote, t.Local)},
	}
	if !t.Transport {
		ps = append(ps, &netlink.XfrmPolicy{Src: ipNet(t.RemoteNet), Dst: ipNet(t.LocalNet), Dir: netlink.XFRM_DIR_FWD, Tmpls: tmpl(t.Remote, t.Local)})
	}
	return ps
}

// Handle is the part of a netlink handle Install and Flush use.
// *netlink.Handle implements it; so does NodeHandle.
type Handle interface {
	XfrmStateAdd(*netlink.XfrmState) error
	XfrmPolicyAdd(*netlink.XfrmPolicy) error
	XfrmStateFlush(netlink.Proto) error
	XfrmPolicyFlush() error
}

// Install adds t's states and then its policies. A refusal that means the
// kernel cannot do the suite is an *UnavailableError.
func Install(h Handle, t Tunnel) error {
	states, err := t.States()
	if err != nil {
		return err
	}
	for _, st := range states {
		if err := h.XfrmStateAdd(st); err != nil {
			return explain(err, t.Suite, st)
		}
	}
	return InstallPolicies(h, t)
}

// InstallPolicies adds only t's policies.
func InstallPolicies(h Handle, t Tunnel) error {
	for _, p := range t.Policies() {
		if err := h.XfrmPolicyAdd(p); err != nil {
			return fmt.Errorf("xfrm: add policy %v -> %v dir %v: %w", p.Src, p.Dst, p.Dir, err)
		}
	}
	return nil
}

// Flush removes every ESP state and every policy.
func Flush(h Handle) error {
	return errors.Join(h.XfrmPolicyFlush(), h.XfrmStateFlush(netlink.XFRM_PROTO_ESP))
}

// UnavailableError says why the running kernel cannot carry a suite.
type UnavailableError struct {
	// Reason is a sentence for the report.
	Reason string
	// Err is the kernel's answer.
	Err error
}

func (e *UnavailableError) Error() string { return e.Reason }
func (e *UnavailableError) Unwrap() error { return e.Err }

// explain maps the kernel's refusal of a state to the reason a report
// gives.
func explain(err error, s crypto.Suite, st *netlink.XfrmState) error {
	alg := ""
	for _, a := range []*netlink.XfrmStateAlgo{st.Aead, st.Crypt, st.Auth} {
		if a != nil {
			if alg != "" {
				alg += " + "
			}
			alg += a.Name
		}
	}
	family := "CONFIG_INET_ESP"
	if st.Dst.To4() == nil {
		family = "CONFIG_INET6_ESP"
	}
	switch {
	case errors.Is(err, syscall.EPROTONOSUPPORT):
		return &UnavailableError{Err: err,
			Reason: fmt.Sprintf("kernel has no ESP (%s not set): adding a state gave %q", family, err.Error())}
	case errors.Is(err, syscall.ENOSYS), errors.Is(err, syscall.ENOENT):
		return &UnavailableError{Err: err,
			Reason: fmt.Sprintf("kernel crypto lacks %s for %s: adding a state gave %q", alg, SuiteName(s), err.Error())}
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return &UnavailableError{Err: err, Reason: fmt.Sprintf("not permitted to add XFRM states (needs CAP_NET_ADMIN): %v", err)}
	}
	return fmt.Errorf("xfrm: add state spi 0x%08x %v -> %v (%s): %w", uint32(st.Spi), st.Src, st.Dst, alg, err)
}

var extAck sync.Once

// NodeHandle runs netlink requests in a testbed namespace: each request
// opens its XFRM socket on a thread switched into the namespace, with
// extended acknowledgements on, so that errors carry the kernel's message.
type NodeHandle struct{ Node *testbed.Node }

func (h NodeHandle) do(fn func() error) error {
	extAck.Do(func() { nl.EnableErrorMessageReporting = true })
	return h.Node.Do(fn)
}

// StateStats are a state's counters.
type StateStats struct {
	// Packets and Bytes are what the state processed (its current
	// lifetime).
	Packets, Bytes uint64
	// Drops are the packets it dropped: replayed, outside the replay
	// window, or failing the integrity check.
	Drops uint64
}

// ReadStats returns the counters of the ESP state with the given SPI in
// the node's namespace.
func ReadStats(h NodeHandle, spi uint32) (StateStats, error) {
	all, err := ReadAllStats(h)
	if err != nil {
		return StateStats{}, err
	}
	st, ok := all[spi]
	if !ok {
		return StateStats{}, fmt.Errorf("xfrm: no ESP state with SPI 0x%08x in %s", spi, h.Node.Name)
	}
	return st, nil
}

// ReadAllStats reads the counters of every ESP state in h's namespace, by
// SPI, with one dump.
func ReadAllStats(h NodeHandle) (map[uint32]StateStats, error) {
	var states []netlink.XfrmState
	if err := h.do(func() (err error) {
		states, err = netlink.XfrmStateList(netlink.FAMILY_ALL)
		return err
	}); err != nil {
		return nil, fmt.Errorf("xfrm: list states in %s: %w", h.Node.Name, err)
	}
	all := make(map[uint32]StateStats, len(states))
	for _, st := range states {
		if st.Proto == netlink.XFRM_PROTO_ESP {
			s := st.Statistics
			all[uint32(st.Spi)] = StateStats{Packets: s.Packets, Bytes: s.Bytes,
				Drops: uint64(s.ReplayWindow) + uint64(s.Replay) + uint64(s.Failed)}
		}
	}
	return all, nil
}

// XfrmStateAdd adds a state.
func (h NodeHandle) XfrmStateAdd(st *netlink.XfrmState) error {
	return h.do(func() error { return netlink.XfrmStateAdd(st) })
}

// XfrmPolicyAdd adds a policy.
func (h NodeHandle) XfrmPolicyAdd(p *netlink.XfrmPolicy) error {
	return h.do(func() error { return netlink.XfrmPolicyAdd(p) })
}

// XfrmStateFlush removes every state of proto.
func (h NodeHandle) XfrmStateFlush(proto netlink.Proto) error {
	return h.do(func() error { return netlink.XfrmStateFlush(proto) })
}

// XfrmPolicyFlush removes every policy.
func (h NodeHandle) XfrmPolicyFlush() error {
	return h.do(func() error { return netlink.XfrmPolicyFlush() })
}
