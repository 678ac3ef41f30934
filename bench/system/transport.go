package system

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/espd/espd/bench/xfrm"
	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
)

// EspdTransport is espd on gwA and gwB in transport mode between their
// transit addresses: the hosts' own traffic to each other, keyed through
// the control socket as the espd system's tunnel, with the same SPIs,
// reqid and deterministic keys (SuiteKeys).
type EspdTransport struct {
	hosts
	name, label string
	encap       bool

	gw  [2]*espdProc
	dir string
	env *Env
}

// NewEspdTransport returns the host-to-host espd system called name;
// encap selects ESP-in-UDP (port 4500).
func NewEspdTransport(name, label string, encap bool) *EspdTransport {
	return &EspdTransport{name: name, label: label, encap: encap}
}

// Name implements System.
func (e *EspdTransport) Name() string { return e.name }

// Label implements System.
func (e *EspdTransport) Label() string { return e.label }

// PerSuite implements System.
func (*EspdTransport) PerSuite() bool { return true }

// Cipher implements System.
func (*EspdTransport) Cipher() string { return "" }

// Available implements System: the harness builds espd itself.
func (*EspdTransport) Available(*Env) error { return nil }

// Setup implements System: a line of two hosts (newHostLine) with espd
// started on both.
func (e *EspdTransport) Setup(ctx context.Context, env *Env) error {
	var err error
	if e.dir, err = env.dir(e.name); err != nil {
		return err
	}
	e.env, e.a = env, addrsOf(env.Family)
	if e.top, err = newHostLine(ctx, env); err != nil {
		return err
	}
	for i, node := range e.nodes() {
		p, err := startEspd(ctx, env.EspdBin, node, e.dir, "", env.espdExtra()...)
		if err != nil {
			return err
		}
		e.gw[i] = p
	}
	return nil
}

// keyEspdTransport installs one host's side of the transport-mode
// association between self and peer: its outbound and inbound states and
// the out and in policies between the two addresses, all in transport
// mode.
func keyEspdTransport(ctx context.Context, c *control.Client, s crypto.Suite, self, peer netip.Addr, outSPI, inSPI uint32, encap bool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := errors.Join(c.FlushPolicies(ctx), c.FlushSAs(ctx)); err != nil {
		return err
	}
	for _, cfg := range []sa.Config{
		espdState(s, sa.DirOut, outSPI, self, peer, encap),
		espdState(s, sa.DirIn, inSPI, peer, self, encap),
	} {
		cfg.Mode = sa.ModeTransport
		if err := c.AddSA(ctx, cfg); err != nil {
			return fmt.Errorf("add transport-mode state 0x%08x: %w", cfg.SPI, err)
		}
	}
	for _, p := range transportPolicies(self, peer) {
		if _, err := c.AddPolicy(ctx, p); err != nil {
			return fmt.Errorf("add transport-mode policy %v -> %v %v: %w", p.Src, p.Dst, p.Dir, err)
		}
	}
	return nil
}

// transportPolicies are a host's policies of the association between self
// and peer: out from self to peer, in from peer to self, each selecting
// the one address at either end, protected in transport mode.
func transportPolicies(self, peer netip.Addr) []sa.Policy {
	return []sa.Policy{
		{Selector: sa.Selector{Src: hostPrefix(self), Dst: hostPrefix(peer)}, Dir: sa.DirOut, Action: sa.ActionProtect,
			ReqID: ReqID, Mode: sa.ModeTransport},
		{Selector: sa.Selector{Src: hostPrefix(peer), Dst: hostPrefix(self)}, Dir: sa.DirIn, Action: sa.ActionProtect,
			ReqID: ReqID, Mode: sa.ModeTransport},
	}
}

// Key implements System: the same deterministic keys on both hosts; a
// suite espd's crypto refuses is an *UnavailableError saying
// RefusedByEspd.
func (e *EspdTransport) Key(ctx context.Context, s crypto.Suite) error {
	if err := refusedByEspd(s); err != nil {
		return err
	}
	for i, side := range []struct {
		self, peer netip.Addr
		out, in    uint32
	}{{e.a.gwA, e.a.gwB, SPIAB, SPIBA}, {e.a.gwB, e.a.gwA, SPIBA, SPIAB}} {
		p := e.gw[i]
		if err := p.use(ctx, func(c *control.Client) error {
			return keyEspdTransport(ctx, c, s, side.self, side.peer, side.out, side.in, e.encap)
		}); err != nil {
			return fmt.Errorf("espd on %s: %w", p.node.Role, err)
		}
	}
	return nil
}

// Unkey implements System.
func (e *EspdTransport) Unkey(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var errs []error
	for _, p := range e.gw {
		if p != nil && p.proc != nil {
			errs = append(errs, p.use(ctx, func(c *control.Client) error {
				return errors.Join(c.FlushPolicies(ctx), c.FlushSAs(ctx))
			}))
		}
	}
	return errors.Join(errs...)
}

// Gateways implements System: espd on gwA and on gwB.
func (e *EspdTransport) Gateways() (a, b []int) { return espdPids(e.gw[0]), espdPids(e.gw[1]) }

// Counters implements System: gwA's outbound state and gwB's inbound one
// (SPIAB, to gwB), as the espd system's.
func (e *EspdTransport) Counters(ctx context.Context) (Counters, bool, error) {
	c, err := espdCounters(ctx, e.gw[0], e.gw[1], SPIAB, e.a.gwB)
	return c, true, err
}

// ProfileCPU implements Profiler: both hosts' espd at once.
func (e *EspdTransport) ProfileCPU(ctx context.Context, d time.Duration, pathA, pathB string) error {
	if !e.env.Profile {
		return errors.New("system: espd runs without --pprof-listen (Env.Profile off)")
	}
	errc := make(chan error, 2)
	for i, path := range []string{pathA, pathB} {
		go func() { errc <- fetchProfile(ctx, e.gw[i].node, d, path) }()
	}
	return errors.Join(<-errc, <-errc)
}

// Close implements System.
func (e *EspdTransport) Close() error {
	errs := []error{e.gw[1].close(), e.gw[0].close()}
	if e.top != nil {
		errs = append(errs, e.top.Close())
	}
	return errors.Join(errs...)
}

// XFRMTransport is the kernel's own ESP in transport mode between gwA's
// and gwB's transit addresses, configured over netlink with the same
// suite, SPIs and keys as espd-transport. As for the xfrm system, whether
// the kernel can do it shows when Key adds the states: a kernel without
// ESP or without the suite's algorithms makes every suite an
// *UnavailableError with the kernel's reason.
type XFRMTransport struct {
	hosts
}

// Name implements System.
func (*XFRMTransport) Name() string { return "xfrm-transport" }

// Label implements System.
func (*XFRMTransport) Label() string { return hostLabel("kernel XFRM") }

// PerSuite implements System.
func (*XFRMTransport) PerSuite() bool { return true }

// Cipher implements System.
func (*XFRMTransport) Cipher() string { return "" }

// Available implements System: whether the kernel has ESP shows per suite.
func (*XFRMTransport) Available(*Env) error { return nil }

// Setup implements System: a line of two hosts (newHostLine).
func (x *XFRMTransport) Setup(ctx context.Context, env *Env) error {
	x.a = addrsOf(env.Family)
	var err error
	x.top, err = newHostLine(ctx, env)
	return err
}

// associations returns gwA's and gwB's side of the transport-mode
// association for suite s: the xfrm system's SPIs and keys, between the
// hosts' transit addresses.
func (x *XFRMTransport) associations(s crypto.Suite) (a, b xfrm.Tunnel) {
	a = xfrm.Tunnel{Suite: s, Transport: true, Local: x.a.gwA, Remote: x.a.gwB,
		LocalNet: hostPrefix(x.a.gwA), RemoteNet: hostPrefix(x.a.gwB),
		OutSPI: SPIAB, InSPI: SPIBA, ReqID: ReqID, ReplayWindow: xfrm.MaxReplayWindow}
	a.OutEncKey, a.OutIntegKey = SuiteKeys(s, SPIAB)
	a.InEncKey, a.InIntegKey = SuiteKeys(s, SPIBA)
	b = xfrm.Tunnel{Suite: s, Transport: true, Local: x.a.gwB, Remote: x.a.gwA,
		LocalNet: hostPrefix(x.a.gwB), RemoteNet: hostPrefix(x.a.gwA),
		OutSPI: SPIBA, InSPI: SPIAB, ReqID: ReqID, ReplayWindow: xfrm.MaxReplayWindow,
		OutEncKey: a.InEncKey, OutIntegKey: a.InIntegKey, InEncKey: a.OutEncKey, InIntegKey: a.OutIntegKey}
	return a, b
}

// Key implements System: gwA's side, then gwB's; a refusal that means the
// kernel cannot do the suite is an *UnavailableError, with nothing left
// keyed.
func (x *XFRMTransport) Key(ctx context.Context, s crypto.Suite) error {
	ta, tb := x.associations(s)
	for i, node := range x.nodes() {
		if err := xfrm.Install(xfrm.NodeHandle{Node: node}, [2]xfrm.Tunnel{ta, tb}[i]); err != nil {
			_ = x.Unkey(ctx)
			var ue *xfrm.UnavailableError
			if errors.As(err, &ue) {
				return &UnavailableError{Reason: ue.Reason}
			}
			return fmt.Errorf("xfrm on %s: %w", node.Role, err)
		}
	}
	return nil
}

// Unkey implements System: it flushes both hosts' states and policies.
func (x *XFRMTransport) Unkey(context.Context) error {
	return errors.Join(xfrm.Flush(xfrm.NodeHandle{Node: x.top.GwA}), xfrm.Flush(xfrm.NodeHandle{Node: x.top.GwB}))
}

// Gateways implements System: the kernel does the work, in softirq.
func (*XFRMTransport) Gateways() (a, b []int) { return nil, nil }

// Counters implements System: gwA's outbound state and gwB's inbound one
// (SPIAB), as the xfrm system's.
func (x *XFRMTransport) Counters(context.Context) (Counters, bool, error) {
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
func (x *XFRMTransport) Close() error {
	if x.top == nil {
		return nil
	}
	return x.top.Close()
}
