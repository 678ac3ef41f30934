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
type XFRM struct {
	top *testbed.Topology
	a   addrs
}

// Name implements System.
func (*XFRM) Name() string { return "xfrm" }

// Label implements System.
func (*XFRM) Label() string { return "kernel XFRM" }

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

// Key implements System.
func (x *XFRM) Key(ctx context.Context, s crypto.Suite) error {
	ta, tb := x.tunnels(s)
	for _, side := range []struct {
		node *testbed.Node
		t    xfrm.Tunnel
	}{{x.top.GwA, ta}, {x.top.GwB, tb}} {
		if err := xfrm.Install(xfrm.NodeHandle{Node: side.node}, side.t); err != nil {
			_ = x.Unkey(ctx)
			var ue *xfrm.UnavailableError
			if errors.As(err, &ue) {
				return &UnavailableError{Reason: ue.Reason}
			}
			return fmt.Errorf("xfrm on %s: %w", side.node.Role, err)
		}
	}
	return nil
}

// Unkey implements System.
func (x *XFRM) Unkey(context.Context) error {
	return errors.Join(xfrm.Flush(xfrm.NodeHandle{Node: x.top.GwA}), xfrm.Flush(xfrm.NodeHandle{Node: x.top.GwB}))
}

// Topology implements System.
func (x *XFRM) Topology() *testbed.Topology { return x.top }

// Gateways implements System: the kernel does the work, in softirq.
func (*XFRM) Gateways() (a, b []int) { return nil, nil }

// Counters implements System.
func (*XFRM) Counters(context.Context) (Counters, bool, error) { return Counters{}, false, nil }

// Close implements System.
func (x *XFRM) Close() error {
	if x.top == nil {
		return nil
	}
	return x.top.Close()
}
