package system

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/espd/espd/bench/xfrm"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
)

// KeyTunnels implements Tunnels: n state pairs and policy pairs in each
// gateway's kernel, and routes to the other side's tunnel addresses over
// the transit link (XFRM's output policy is looked up after the route).
func (x *XFRM) KeyTunnels(ctx context.Context, s crypto.Suite, n int) error {
	if err := checkTunnels(n); err != nil {
		return err
	}
	if err := x.Unkey(ctx); err != nil {
		return err
	}
	f := testbed.IPv4
	if x.a.gwA.Is6() {
		f = testbed.IPv6
	}
	cRange := testbed.Pick(f, TunnelClientV4, TunnelClientV6)
	sRange := testbed.Pick(f, TunnelServerV4, TunnelServerV6)
	for _, r := range []struct {
		node *testbed.Node
		dst  netip.Prefix
		via  netip.Addr
	}{{x.top.GwA, sRange, x.a.gwB}, {x.top.GwB, cRange, x.a.gwA}} {
		if _, err := r.node.IP(ctx, "route", "replace", r.dst.String(), "via", r.via.String(), "dev", testbed.IfTransit); err != nil {
			return err
		}
	}
	tunnels := make([][2]xfrm.Tunnel, n)
	for i := range n {
		ab, ba := TunnelSPIs(i)
		cAddr, sAddr := TunnelAddrs(f, i)
		ta := xfrm.Tunnel{Suite: s, Local: x.a.gwA, Remote: x.a.gwB, LocalNet: hostPrefix(cAddr), RemoteNet: hostPrefix(sAddr),
			OutSPI: ab, InSPI: ba, ReqID: i + 1, ReplayWindow: xfrm.MaxReplayWindow}
		ta.OutEncKey, ta.OutIntegKey = SuiteKeys(s, ab)
		ta.InEncKey, ta.InIntegKey = SuiteKeys(s, ba)
		tb := xfrm.Tunnel{Suite: s, Local: x.a.gwB, Remote: x.a.gwA, LocalNet: hostPrefix(sAddr), RemoteNet: hostPrefix(cAddr),
			OutSPI: ba, InSPI: ab, ReqID: i + 1, ReplayWindow: xfrm.MaxReplayWindow,
			OutEncKey: ta.InEncKey, OutIntegKey: ta.InIntegKey, InEncKey: ta.OutEncKey, InIntegKey: ta.OutIntegKey}
		tunnels[i] = [2]xfrm.Tunnel{ta, tb}
	}
	if err := x.install(ctx, s, tunnels); err != nil {
		return err
	}
	x.keyed = n
	return nil
}

// TunnelCounters implements Tunnels: per tunnel, gwA's outbound state and
// gwB's inbound one of the direction client -> server, as for espd.
func (x *XFRM) TunnelCounters(context.Context) ([]Counters, bool, error) {
	a, err := xfrm.ReadAllStats(xfrm.NodeHandle{Node: x.top.GwA})
	if err != nil {
		return nil, true, err
	}
	b, err := xfrm.ReadAllStats(xfrm.NodeHandle{Node: x.top.GwB})
	if err != nil {
		return nil, true, err
	}
	out := make([]Counters, x.keyed)
	for i := range out {
		ab, _ := TunnelSPIs(i)
		sa, okA := a[ab]
		sb, okB := b[ab]
		if !okA || !okB {
			return nil, true, fmt.Errorf("xfrm: tunnel %d's state 0x%08x missing on gwA or gwB", i, ab)
		}
		out[i] = Counters{OutPackets: sa.Packets, InPackets: sb.Packets, InDrops: sb.Drops}
	}
	return out, true, nil
}
