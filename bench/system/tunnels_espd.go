package system

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
)

// KeyTunnels implements Tunnels: n state pairs and n policy pairs on each
// espd, tunnel i between TunnelAddrs(i) with reqid i+1.
func (e *Espd) KeyTunnels(ctx context.Context, s crypto.Suite, n int) error {
	if err := checkTunnels(n); err != nil {
		return err
	}
	e.tunnels = n
	for side, p := range e.gw {
		if err := p.use(ctx, func(c *control.Client) error {
			return keyEspdTunnels(ctx, c, s, e.env.Family, e.a, side == 1, n, e.encap)
		}); err != nil {
			return fmt.Errorf("espd on %s: %w", p.node.Role, err)
		}
	}
	return nil
}

// keyEspdTunnels installs one gateway's side of n tunnels (gwB's if
// atB).
func keyEspdTunnels(ctx context.Context, c *control.Client, s crypto.Suite, f testbed.Family, a addrs, atB bool, n int, encap bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+time.Duration(n)*50*time.Millisecond)
	defer cancel()
	if err := errors.Join(c.FlushPolicies(ctx), c.FlushSAs(ctx)); err != nil {
		return err
	}
	for i := range n {
		ab, ba := TunnelSPIs(i)
		cAddr, sAddr := TunnelAddrs(f, i)
		local, remote, lnet, rnet, out, in := a.gwA, a.gwB, hostPrefix(cAddr), hostPrefix(sAddr), ab, ba
		if atB {
			local, remote, lnet, rnet, out, in = a.gwB, a.gwA, hostPrefix(sAddr), hostPrefix(cAddr), ba, ab
		}
		reqid := uint32(i + 1)
		for _, cfg := range []sa.Config{
			{SPI: out, Dir: sa.DirOut, Src: local, Dst: remote, Suite: s, ReqID: reqid},
			{SPI: in, Dir: sa.DirIn, Src: remote, Dst: local, Suite: s, ReqID: reqid, ReplayWindow: EspdReplayWindow},
		} {
			cfg.EncKey, cfg.IntegKey = SuiteKeys(s, cfg.SPI)
			if encap {
				cfg.EncapSrcPort, cfg.EncapDstPort = 4500, 4500
			}
			if err := c.AddSA(ctx, cfg); err != nil {
				return fmt.Errorf("add state 0x%08x: %w", cfg.SPI, err)
			}
		}
		for _, p := range []sa.Policy{
			{Selector: sa.Selector{Src: lnet, Dst: rnet}, Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: reqid},
			{Selector: sa.Selector{Src: rnet, Dst: lnet}, Dir: sa.DirIn, Action: sa.ActionProtect, ReqID: reqid},
		} {
			if _, err := c.AddPolicy(ctx, p); err != nil {
				return fmt.Errorf("add policy %v -> %v %v: %w", p.Src, p.Dst, p.Dir, err)
			}
		}
	}
	return nil
}

// TunnelCounters implements Tunnels: per tunnel, gwA's outbound state and
// gwB's inbound one of the direction client -> server.
func (e *Espd) TunnelCounters(ctx context.Context) ([]Counters, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var per [2]map[uint32]sa.Stats
	for side, p := range e.gw {
		var st control.Stats
		err := p.use(ctx, func(c *control.Client) (err error) { st, err = c.Stats(ctx); return err })
		if err != nil {
			return nil, true, fmt.Errorf("espd on %s: %w", p.node.Role, err)
		}
		per[side] = map[uint32]sa.Stats{}
		for _, s := range st.SAs {
			per[side][s.Config.SPI] = s.Stats
		}
	}
	out := make([]Counters, e.tunnels)
	for i := range out {
		ab, _ := TunnelSPIs(i)
		sa, okA := per[0][ab]
		sb, okB := per[1][ab]
		if !okA || !okB {
			return nil, true, fmt.Errorf("espd: tunnel %d's state 0x%08x missing on gwA or gwB", i, ab)
		}
		out[i].OutPackets, out[i].InPackets = sa.Packets, sb.Packets
		for _, d := range sb.Drops {
			out[i].InDrops += d
		}
	}
	return out, true, nil
}
