package system

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
)

// KeyTunnels implements Tunnels: both charons restarted for the suite with
// one IKE_SA whose connection has n children, child i between tunnel i's
// blocks, each brought up from gwA as its own CHILD_SA (its own
// SPIs, and with libipsec its own route in table 220).
func (c *Charon) KeyTunnels(ctx context.Context, s crypto.Suite, n int) error {
	if err := checkTunnels(n); err != nil {
		return err
	}
	if err := c.Unkey(ctx); err != nil {
		return err
	}
	// kernel-libipsec routes a child's destination into ipsec0 with a
	// source address of the gateway inside the child's local selector,
	// and refuses the child without one: so each child's selectors are
	// its tunnel's blocks, which hold a gateway address on each side.
	if err := c.addTunnelGateways(ctx, n); err != nil {
		return err
	}
	nodes := []*testbed.Node{c.top.GwA, c.top.GwB}
	for i, node := range nodes {
		local, remote := c.a.gwA, c.a.gwB
		if i == 1 {
			local, remote = remote, local
		}
		p, err := c.startCharon(ctx, node, i)
		if err != nil {
			return err
		}
		c.gw[i] = p
		conf := charonTunnelsConf(c.env.Family, i == 1, n, local.String(), remote.String(),
			charonID(node.Role), charonID(nodes[1-i].Role), s)
		path := filepath.Join(p.dir, "swanctl.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return err
		}
		if out, err := swanctl(ctx, 60*time.Second, p.uri, "--load-all", "--noprompt", "--file", path); err != nil {
			return fmt.Errorf("charon on %s: load: %w\n%s", node.Role, err, out)
		}
	}
	// The first child brings up the IKE_SA; the others follow, a few at
	// a time.
	initiate := func(i int) error {
		child := fmt.Sprintf("bench%d", i)
		if out, err := swanctl(ctx, 60*time.Second, c.gw[0].uri, "--initiate", "--child", child, "--timeout", "50"); err != nil {
			return fmt.Errorf("charon: initiate %s (%v): %w\n%s", child, s, err, lastLines(out, 10))
		}
		return nil
	}
	if err := initiate(0); err != nil {
		return err
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, 8)
	)
	for i := 1; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := initiate(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// addTunnelGateways gives gwA and gwB their address in each of n tunnels'
// blocks (on their LAN interface, as hosts: no route comes with them).
func (c *Charon) addTunnelGateways(ctx context.Context, n int) error {
	var la, lb []string
	for i := range n {
		a, b := tunnelGateways(c.env.Family, i)
		nodad := ""
		if a.Is6() {
			nodad = " nodad"
		}
		la = append(la, fmt.Sprintf("addr replace %s dev %s%s", hostPrefix(a), testbed.IfLAN, nodad))
		lb = append(lb, fmt.Sprintf("addr replace %s dev %s%s", hostPrefix(b), testbed.IfLAN, nodad))
	}
	if err := ipBatch(ctx, c.env, c.top.GwA, la); err != nil {
		return err
	}
	return ipBatch(ctx, c.env, c.top.GwB, lb)
}

// charonTunnelsConf is a site-to-site connection with a PSK and n
// children, from gwA's side or (atB) gwB's.
func charonTunnelsConf(f testbed.Family, atB bool, n int, local, remote, localID, remoteID string, s crypto.Suite) string {
	var b strings.Builder
	fmt.Fprintf(&b, "connections {\n\tbench {\n\t\tversion = 2\n\t\tlocal_addrs = %s\n\t\tremote_addrs = %s\n\t\tproposals = %s\n", local, remote, ikeProp)
	fmt.Fprintf(&b, "\t\tlocal {\n\t\t\tauth = psk\n\t\t\tid = %s\n\t\t}\n\t\tremote {\n\t\t\tauth = psk\n\t\t\tid = %s\n\t\t}\n\t\tchildren {\n", localID, remoteID)
	for i := range n {
		cAddr, sAddr := TunnelAddrs(f, i)
		lts, rts := tunnelBlock(cAddr), tunnelBlock(sAddr)
		if atB {
			lts, rts = rts, lts
		}
		fmt.Fprintf(&b, "\t\t\tbench%d {\n\t\t\t\tlocal_ts = %s\n\t\t\t\tremote_ts = %s\n\t\t\t\tesp_proposals = %v\n\t\t\t\tmode = tunnel\n\t\t\t\tstart_action = none\n\t\t\t}\n", i, lts, rts, s)
	}
	fmt.Fprintf(&b, "\t\t}\n\t}\n}\nsecrets {\n\tike-bench {\n\t\tid-a = %s\n\t\tid-b = %s\n\t\tsecret = \"%s\"\n\t}\n}\n", charonID("gwA"), charonID("gwB"), charonPSK)
	return b.String()
}

// TunnelCounters implements Tunnels: the harness reads no per-CHILD_SA
// counters from charon.
func (*Charon) TunnelCounters(context.Context) ([]Counters, bool, error) { return nil, false, nil }
