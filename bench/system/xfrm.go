package system

import (
	"context"
	"errors"
	"fmt"

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
//
// With NoAESNI set (the -noaesni twins xfrm-noaesni and
// xfrm-pcrypt-noaesni) the states run on the kernel's generic (C) drivers,
// as on a CPU without AES-NI: Key makes the kernel pick the suite's generic
// driver (xfrm.ForceGeneric: rfc4106(gcm_base(ctr(aes-generic),ghash-generic)),
// rfc7539esp(chacha20-generic,poly1305-generic), cbc(aes-generic)), and with
// Pcrypt pcrypt(<that driver>), checks in /proc/crypto that the states'
// transforms are built on it, and Unkey restores the normal drivers.
type XFRM struct {
	Pcrypt  bool
	NoAESNI bool

	top    *testbed.Topology
	a      addrs
	pcrypt *xfrm.Pcrypt
	// generic is the generic driver NoAESNI keyed on, and driver the
	// transform the states use (Driver).
	generic *xfrm.Generic
	driver  string
	// keyed is the number of tunnels KeyTunnels keyed (TunnelCounters).
	keyed int
}

// Name implements System.
func (x *XFRM) Name() string {
	name := "xfrm"
	if x.Pcrypt {
		name += "-pcrypt"
	}
	if x.NoAESNI {
		name += "-noaesni"
	}
	return name
}

// Label implements System.
func (x *XFRM) Label() string {
	label := "kernel XFRM"
	if x.Pcrypt {
		label += ", pcrypt"
	}
	if x.NoAESNI {
		label += ", no AES-NI (generic drivers)"
	}
	return label
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
// states use, and without it on no pcrypt instance; with NoAESNI on the
// suite's generic driver. On failure it leaves nothing keyed.
func (x *XFRM) install(ctx context.Context, s crypto.Suite, tunnels [][2]xfrm.Tunnel) error {
	first := tunnels[0][0]
	aead, crypt, auth, err := xfrm.Algorithms(s, first.OutEncKey, first.OutIntegKey)
	if err != nil {
		return fmt.Errorf("xfrm: %w", err)
	}
	name, espName := "", ""
	if aead != nil {
		name, espName = aead.Name, xfrm.ESPName(aead.Name, "", "")
	} else {
		name, espName = crypt.Name, xfrm.ESPName("", crypt.Name, auth.Name)
	}
	if x.Pcrypt && aead == nil {
		return &UnavailableError{Reason: "pcrypt wraps AEADs only: " + SuiteName(s) + " is a CBC suite (cipher + HMAC)"}
	}
	unavailable := func(err error) error {
		var ue *xfrm.UnavailableError
		if errors.As(err, &ue) {
			return &UnavailableError{Reason: ue.Reason}
		}
		return err
	}
	if x.Pcrypt || x.NoAESNI {
		// Whether the kernel has ESP at all first: that is the reason to
		// give where it has not, rather than what crypto_user lacks.
		if err := xfrm.Install(xfrm.NodeHandle{Node: x.top.GwA}, first); err != nil {
			_ = x.Unkey(ctx)
			if ue := unavailable(err); IsUnavailable(ue) {
				return ue
			}
			return fmt.Errorf("xfrm on %s: %w", x.top.GwA.Role, err)
		}
		if err := xfrm.Flush(xfrm.NodeHandle{Node: x.top.GwA}); err != nil {
			return err
		}
	}
	if x.NoAESNI {
		g, err := xfrm.ForceGeneric(name)
		if err != nil {
			return unavailable(err)
		}
		x.generic = &g
	} else if err := xfrm.RemoveStaleGeneric(name); err != nil {
		return fmt.Errorf("a generic driver forced for %s is in place and would serve %s: %w", name, x.Name(), err)
	}
	var before int
	switch {
	case x.Pcrypt:
		p, err := xfrm.InstantiatePcrypt(aead.Name)
		if err != nil {
			_ = x.Unkey(ctx)
			return unavailable(err)
		}
		x.pcrypt = &p
		if x.generic != nil && p.Driver != "pcrypt("+x.generic.Driver+")" {
			_ = x.Unkey(ctx)
			return fmt.Errorf("xfrm: pcrypt instantiated as %s, not on %s", p.Driver, x.generic.Driver)
		}
		if before, err = p.Refcnt(); err != nil {
			_ = x.Unkey(ctx)
			return err
		}
	case aead != nil:
		// A pcrypt instance left over (an earlier run killed) would
		// serve these states too.
		if err := xfrm.RemovePcrypt(aead.Name); err != nil {
			_ = x.Unkey(ctx)
			return fmt.Errorf("a pcrypt instance of %s is in place and would serve %s: %w", aead.Name, x.Name(), err)
		}
	}
	for i, t := range tunnels {
		for j, node := range []*testbed.Node{x.top.GwA, x.top.GwB} {
			if err := xfrm.Install(xfrm.NodeHandle{Node: node}, t[j]); err != nil {
				_ = x.Unkey(ctx)
				if ue := unavailable(err); IsUnavailable(ue) {
					return ue
				}
				if len(tunnels) > 1 {
					return fmt.Errorf("xfrm on %s, tunnel %d: %w", node.Role, i, err)
				}
				return fmt.Errorf("xfrm on %s: %w", node.Role, err)
			}
		}
	}
	if err := x.check(espName, tunnels, before); err != nil {
		_ = x.Unkey(ctx)
		return err
	}
	return nil
}

// check checks in /proc/crypto that the keyed states use what the system
// promises (plain XFRM no pcrypt, XFRM on pcrypt its instance, NoAESNI the
// generic driver), and records the transform they use (Driver).
func (x *XFRM) check(espName string, tunnels [][2]xfrm.Tunnel, before int) error {
	algs, err := xfrm.ProcCrypto()
	if err != nil {
		return err
	}
	var on []string
	if x.generic != nil {
		on = append(on, x.generic.Driver)
	}
	if x.pcrypt != nil {
		on = append(on, x.pcrypt.Driver)
	}
	if x.driver, err = xfrm.Uses(algs, espName, x.pcrypt != nil, on...); err != nil {
		return fmt.Errorf("%s: %w", x.Name(), err)
	}
	if x.pcrypt != nil {
		states := statesPerTunnel * len(tunnels)
		after, err := x.pcrypt.Refcnt()
		if err == nil && after-before < states {
			err = fmt.Errorf("the states do not use %s: its /proc/crypto refcnt went from %d to %d for %d states",
				x.pcrypt.Driver, before, after, states)
		}
		return err
	}
	return nil
}

// Unkey implements System: it flushes the states and policies, removes
// the pcrypt instance it made and restores the drivers NoAESNI changed.
func (x *XFRM) Unkey(context.Context) error {
	x.keyed = 0
	x.driver = ""
	err := errors.Join(xfrm.Flush(xfrm.NodeHandle{Node: x.top.GwA}), xfrm.Flush(xfrm.NodeHandle{Node: x.top.GwB}))
	if x.pcrypt != nil {
		err = errors.Join(err, x.pcrypt.Release())
		x.pcrypt = nil
	}
	if x.generic != nil {
		err = errors.Join(err, x.generic.Release())
		x.generic = nil
	}
	return err
}

// KernelDriver is a system whose states run on the kernel's crypto: it
// names the driver of the transform its keyed states use.
type KernelDriver interface {
	// Driver is the transform's driver after Key, or "".
	Driver() string
}

// Driver implements KernelDriver: the driver of the transform the kernel's ESP
// picked for the keyed states, read from /proc/crypto after Key, such as
// seqiv(rfc4106(gcm_base(ctr(aes-generic),ghash-generic))); "" when not keyed.
func (x *XFRM) Driver() string { return x.driver }

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

// Close implements System. A run stopped while the system was keyed
// still gets the kernel's drivers back: the pcrypt instance and the
// forced generic driver are released once the namespaces, and with them
// the states, are gone.
func (x *XFRM) Close() error {
	var err error
	if x.top != nil {
		err = x.top.Close()
	}
	if x.pcrypt != nil {
		err = errors.Join(err, x.pcrypt.Release())
		x.pcrypt = nil
	}
	if x.generic != nil {
		err = errors.Join(err, x.generic.Release())
		x.generic = nil
	}
	return err
}
