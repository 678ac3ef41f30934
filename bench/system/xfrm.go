package system

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/espd/espd/bench/xfrm"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
)

// XFRM is the kernel's own ESP, configured over netlink with the same
// suite, keys and SPIs as espd. Whether the kernel can do a suite is found
// by adding the states: a refusal becomes an *UnavailableError with the
// kernel's reason.
//
// With Pcrypt set (the system xfrm-pcrypt) the AEAD runs through the
// kernel's pcrypt template, as strongSwan's users set it up for
// multi-core gateways: Key instantiates pcrypt(<the AEAD's driver>)
// through the crypto user interface before adding the states, checks in
// /proc/crypto that the states took it, and removes it in Unkey. pcrypt
// wraps AEADs only; CBC suites are unavailable for it.
type XFRM struct {
	Pcrypt bool

	top    *testbed.Topology
	a      addrs
	pcrypt *xfrm.Pcrypt
	aead   string // the keyed AEAD's kernel name, for Unkey
	// keyed is the number of tunnels KeyTunnels keyed (TunnelCounters).
	keyed int
}

// Name implements System.
func (x *XFRM) Name() string {
	if x.Pcrypt {
		return "xfrm-pcrypt"
	}
	return "xfrm"
}

// Label implements System.
func (x *XFRM) Label() string {
	if x.Pcrypt {
		return "kernel XFRM, pcrypt"
	}
	return "kernel XFRM"
}

// PerSuite implements System.
func (*XFRM) PerSuite() bool { return true }

// Cipher implements System.
func (*XFRM) Cipher() string { return "" }

// Available implements System: whether the kernel has ESP shows per suite.
func (*XFRM) Available(*Env) error { return nil }

// Setup implements System: a line whose gateways route between the LANs
// (XFRM's output policy is looked up after the route).
func (x *XFRM) Setup(ctx context.Context, env *Env) error {
	x.a = addrsOf(env.Family)
	var err error
	x.top, err = newLine(env, true)
	return err
}

func (x *XFRM) tunnels(s crypto.Suite) (a, b xfrm.Tunnel) {
	a = xfrm.Tunnel{Suite: s, Local: x.a.gwA, Remote: x.a.gwB, LocalNet: x.a.lanA, RemoteNet: x.a.lanB,
		OutSPI: SPIAB, InSPI: SPIBA, ReqID: ReqID, ReplayWindow: xfrm.MaxReplayWindow}
	a.OutEncKey, a.OutIntegKey = SuiteKeys(s, SPIAB)
	a.InEncKey, a.InIntegKey = SuiteKeys(s, SPIBA)
	b = xfrm.Tunnel{Suite: s, Local: x.a.gwB, Remote: x.a.gwA, LocalNet: x.a.lanB, RemoteNet: x.a.lanA,
		OutSPI: SPIBA, InSPI: SPIAB, ReqID: ReqID, ReplayWindow: xfrm.MaxReplayWindow,
		OutEncKey: a.InEncKey, OutIntegKey: a.InIntegKey, InEncKey: a.OutEncKey, InIntegKey: a.OutIntegKey}
	return a, b
}

// statesPerTunnel is the number of states a tunnel adds: an outbound and
// an inbound one on each gateway.
const statesPerTunnel = 4

// Key implements System.
func (x *XFRM) Key(ctx context.Context, s crypto.Suite) error {
	ta, tb := x.tunnels(s)
	return x.install(ctx, s, [][2]xfrm.Tunnel{{ta, tb}})
}

// install adds the tunnels, each gwA's side and gwB's, for the suite s:
// with Pcrypt on a pcrypt instance of the suite's AEAD, which it checks the
// states use, and without it on no pcrypt instance. On failure it leaves
// nothing keyed.
func (x *XFRM) install(ctx context.Context, s crypto.Suite, tunnels [][2]xfrm.Tunnel) error {
	first := tunnels[0][0]
	aead, _, _, err := xfrm.Algorithms(s, first.OutEncKey, first.OutIntegKey)
	if err != nil {
		return fmt.Errorf("xfrm: %w", err)
	}
	x.aead = ""
	if aead != nil {
		x.aead = aead.Name
	}
	var before int
	switch {
	case x.Pcrypt && aead == nil:
		return &UnavailableError{Reason: "pcrypt wraps AEADs only: " + SuiteName(s) + " is a CBC suite (cipher + HMAC)"}
	case x.Pcrypt:
		// Whether the kernel has ESP at all first: that is the reason to
		// give where it has not, rather than what pcrypt lacks.
		if err := xfrm.Install(xfrm.NodeHandle{Node: x.top.GwA}, first); err != nil {
			_ = x.Unkey(ctx)
			var ue *xfrm.UnavailableError
			if errors.As(err, &ue) {
				return &UnavailableError{Reason: ue.Reason}
			}
			return fmt.Errorf("xfrm on %s: %w", x.top.GwA.Role, err)
		}
		if err := xfrm.Flush(xfrm.NodeHandle{Node: x.top.GwA}); err != nil {
			return err
		}
		p, err := xfrm.InstantiatePcrypt(aead.Name)
		if err != nil {
			var ue *xfrm.UnavailableError
			if errors.As(err, &ue) {
				return &UnavailableError{Reason: ue.Reason}
			}
			return err
		}
		x.pcrypt = &p
		if before, err = p.Refcnt(); err != nil {
			return err
		}
	case aead != nil:
		// A pcrypt instance left over (an earlier run killed) would
		// serve these states too.
		if err := xfrm.RemovePcrypt(aead.Name); err != nil {
			return fmt.Errorf("a pcrypt instance of %s is in place and would serve plain XFRM: %w", aead.Name, err)
		}
	}
	for i, t := range tunnels {
		for j, node := range []*testbed.Node{x.top.GwA, x.top.GwB} {
			if err := xfrm.Install(xfrm.NodeHandle{Node: node}, t[j]); err != nil {
				_ = x.Unkey(ctx)
				var ue *xfrm.UnavailableError
				if errors.As(err, &ue) {
					return &UnavailableError{Reason: ue.Reason}
				}
				if len(tunnels) > 1 {
					return fmt.Errorf("xfrm on %s, tunnel %d: %w", node.Role, i, err)
				}
				return fmt.Errorf("xfrm on %s: %w", node.Role, err)
			}
		}
	}
	if aead != nil && x.pcrypt == nil {
		// The plain system: its states must not run through pcrypt.
		geniv, err := (xfrm.Pcrypt{Name: aead.Name}).Geniv()
		if err == nil && strings.Contains(geniv, "pcrypt(") {
			err = fmt.Errorf("the kernel's ESP picks %s for %s: plain XFRM would run through pcrypt", geniv, xfrm.GenivName(aead.Name))
		}
		if err != nil {
			_ = x.Unkey(ctx)
			return err
		}
	}
	if x.pcrypt != nil {
		states := statesPerTunnel * len(tunnels)
		after, err := x.pcrypt.Refcnt()
		if err == nil && after-before < states {
			err = fmt.Errorf("the states do not use %s: its /proc/crypto refcnt went from %d to %d for %d states",
				x.pcrypt.Driver, before, after, states)
		}
		if err == nil {
			var geniv string
			if geniv, err = x.pcrypt.Geniv(); err == nil && !strings.Contains(geniv, x.pcrypt.Driver) {
				err = fmt.Errorf("the kernel's ESP picks %s for %s, not one on %s", geniv, xfrm.GenivName(x.aead), x.pcrypt.Driver)
			}
		}
		if err != nil {
			_ = x.Unkey(ctx)
			return err
		}
	}
	return nil
}

// Unkey implements System: it flushes the states and policies, and
// removes the pcrypt instance it made.
func (x *XFRM) Unkey(context.Context) error {
	x.keyed = 0
	err := errors.Join(xfrm.Flush(xfrm.NodeHandle{Node: x.top.GwA}), xfrm.Flush(xfrm.NodeHandle{Node: x.top.GwB}))
	if x.pcrypt != nil {
		err = errors.Join(err, xfrm.RemovePcrypt(x.aead))
		x.pcrypt = nil
	}
	return err
}

// PcryptDriver is the pcrypt instance the keyed states use (xfrm-pcrypt,
// after Key), or "".
func (x *XFRM) PcryptDriver() string {
	if x.pcrypt == nil {
		return ""
	}
	return x.pcrypt.Driver
}

// Topology implements System.
func (x *XFRM) Topology() *testbed.Topology { return x.top }

// Gateways implements System: the kernel does the work, in softirq.
func (*XFRM) Gateways() (a, b []int) { return nil, nil }

// Counters implements System: the packets gwA's outbound state
// protected and gwB's inbound state accepted (their lifetime counters),
// and what gwB's inbound state dropped (replay, outside the window,
// integrity failures), read over netlink.
func (x *XFRM) Counters(context.Context) (Counters, bool, error) {
	out, err := xfrm.ReadStats(xfrm.NodeHandle{Node: x.top.GwA}, SPIAB)
	if err != nil {
		return Counters{}, true, err
	}
	in, err := xfrm.ReadStats(xfrm.NodeHandle{Node: x.top.GwB}, SPIAB)
	if err != nil {
		return Counters{}, true, err
	}
	return Counters{OutPackets: out.Packets, InPackets: in.Packets, InDrops: in.Drops}, true, nil
}

// Close implements System.
func (x *XFRM) Close() error {
	if x.top == nil {
		return nil
	}
	return x.top.Close()
}
