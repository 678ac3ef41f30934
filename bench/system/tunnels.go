package system

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
)

// The inner addresses of the harness's many tunnels: tunnel i (from 0)
// owns block i of four addresses (/30, /126) in the client range and
// block i in the server range. The client holds the block's second
// address, the server likewise, each as a host (/32, /128) of its own on
// its LAN interface, and each tunnel's selector is that host pair. The
// block's first address is for the gateway on that side where a data path
// needs an address of its own inside the local selector (kernel-libipsec
// routes with one); its selector is then the block pair.
var (
	TunnelClientV4 = netip.MustParsePrefix("198.19.16.0/20")
	TunnelServerV4 = netip.MustParsePrefix("198.19.32.0/20")
	TunnelClientV6 = netip.MustParsePrefix("2001:db8:e5d1::/64")
	TunnelServerV6 = netip.MustParsePrefix("2001:db8:e5d2::/64")
)

// MaxTunnels is the most tunnels the harness configures: the IPv4 ranges
// hold 1024 blocks each, and wireguard-go's interface names fit in 15
// bytes up to 9999 spokes.
const MaxTunnels = 1000

// Every system the harness knows carries many tunnels.
var (
	_ Tunnels = (*Routing)(nil)
	_ Tunnels = (*Espd)(nil)
	_ Tunnels = (*XFRM)(nil)
	_ Tunnels = (*Charon)(nil)
	_ Tunnels = (*WireGuard)(nil)
)

// TunnelAddrs returns the client's and the server's inner address of
// tunnel i (from 0).
func TunnelAddrs(f testbed.Family, i int) (client, server netip.Addr) {
	c := testbed.Pick(f, TunnelClientV4, TunnelClientV6).Addr()
	s := testbed.Pick(f, TunnelServerV4, TunnelServerV6).Addr()
	return addrAdd(c, 4*i+2), addrAdd(s, 4*i+2)
}

// tunnelGateways returns gwA's and gwB's address in tunnel i's blocks.
func tunnelGateways(f testbed.Family, i int) (a, b netip.Addr) {
	c := testbed.Pick(f, TunnelClientV4, TunnelClientV6).Addr()
	s := testbed.Pick(f, TunnelServerV4, TunnelServerV6).Addr()
	return addrAdd(c, 4*i+1), addrAdd(s, 4*i+1)
}

// tunnelBlock returns the block (/30, /126) of a tunnel address.
func tunnelBlock(a netip.Addr) netip.Prefix {
	p, _ := a.Prefix(a.BitLen() - 2)
	return p
}

// Tunnels is a System that carries several tunnels at once (site pairs,
// each with its own SAs and policy, or its own WireGuard peer), between
// the inner addresses TunnelAddrs gives.
type Tunnels interface {
	System
	// KeyTunnels configures n tunnels for suite (ignored by systems with
	// their own cipher), replacing whatever Key or an earlier KeyTunnels
	// installed; Unkey removes them (systems that are not keyed per suite
	// remove them at the next KeyTunnels or at Close). An
	// *UnavailableError says why the system cannot carry n tunnels here.
	KeyTunnels(ctx context.Context, suite crypto.Suite, n int) error
	// TunnelCounters returns each tunnel's counters, in tunnel order, or
	// ok false if the system has none the harness reads.
	TunnelCounters(ctx context.Context) (c []Counters, ok bool, err error)
}

// addrAdd returns a + n (n small, no carry out of the last four bytes'
// range).
func addrAdd(a netip.Addr, n int) netip.Addr {
	b := a.AsSlice()
	carry := n
	for i := len(b) - 1; i >= 0 && carry > 0; i-- {
		v := int(b[i]) + carry
		b[i] = byte(v)
		carry = v >> 8
	}
	out, _ := netip.AddrFromSlice(b)
	return out
}

// hostPrefix is a as a single-address prefix.
func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// AddTunnelHosts gives the client and the server of a line the inner
// addresses of n tunnels, and gwA and gwB routes to them on their LAN
// side; the routes between the gateways are each system's own.
func AddTunnelHosts(ctx context.Context, env *Env, top *testbed.Topology, n int) error {
	if n < 1 || n > MaxTunnels {
		return fmt.Errorf("system: %d tunnels: 1 to %d", n, MaxTunnels)
	}
	f := env.Family
	var cl, sv []string
	for i := range n {
		c, s := TunnelAddrs(f, i)
		cl = append(cl, addrLine(hostPrefix(c)))
		sv = append(sv, addrLine(hostPrefix(s)))
	}
	cRange := testbed.Pick(f, TunnelClientV4, TunnelClientV6)
	sRange := testbed.Pick(f, TunnelServerV4, TunnelServerV6)
	client := testbed.Pick(f, testbed.ClientV4, testbed.ClientV6).Addr()
	server := testbed.Pick(f, testbed.ServerV4, testbed.ServerV6).Addr()
	for _, b := range []struct {
		node  *testbed.Node
		lines []string
	}{
		{top.Client, cl},
		{top.Server, sv},
		{top.GwA, []string{fmt.Sprintf("route replace %s via %s dev %s", cRange, client, testbed.IfLAN)}},
		{top.GwB, []string{fmt.Sprintf("route replace %s via %s dev %s", sRange, server, testbed.IfLAN)}},
	} {
		if err := ipBatch(ctx, env, b.node, b.lines); err != nil {
			return err
		}
	}
	return nil
}

func addrLine(p netip.Prefix) string {
	l := fmt.Sprintf("addr add %s dev %s", p, testbed.IfHost)
	if p.Addr().Is6() {
		l += " nodad"
	}
	return l
}

// ipBatch runs ip -batch in node with the given commands.
func ipBatch(ctx context.Context, env *Env, node *testbed.Node, lines []string) error {
	f, err := os.CreateTemp(env.Dir, "ip-batch-")
	if err != nil {
		return fmt.Errorf("system: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(strings.Join(lines, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("system: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	_, err = node.IP(ctx, "-batch", f.Name())
	return err
}

// TunnelSPIs returns the SPIs of tunnel i's states the harness keys itself
// (espd, XFRM): gwA -> gwB and gwB -> gwA. Its reqid is i+1.
func TunnelSPIs(i int) (ab, ba uint32) {
	return 0x0e5e0001 + uint32(i), 0x0e5f0001 + uint32(i)
}

// checkTunnels validates a tunnel count.
func checkTunnels(n int) error {
	if n < 1 || n > MaxTunnels {
		return &UnavailableError{Reason: fmt.Sprintf("%d tunnels: the harness configures 1 to %d", n, MaxTunnels)}
	}
	return nil
}

// KeyTunnels implements Tunnels: the ceiling of many tunnels is many
// host pairs routed in the clear, so the gateways route the tunnel
// ranges over the transit link as they route the LANs.
func (r *Routing) KeyTunnels(ctx context.Context, _ crypto.Suite, n int) error {
	if err := checkTunnels(n); err != nil {
		return err
	}
	for _, rt := range []struct {
		node *testbed.Node
		dst  netip.Prefix
		via  netip.Prefix
	}{
		{r.top.GwA, TunnelServerV4, testbed.GwBTransitV4}, {r.top.GwA, TunnelServerV6, testbed.GwBTransitV6},
		{r.top.GwB, TunnelClientV4, testbed.GwATransitV4}, {r.top.GwB, TunnelClientV6, testbed.GwATransitV6},
	} {
		if _, err := rt.node.IP(ctx, "route", "replace", rt.dst.String(), "via", rt.via.Addr().String(), "dev", testbed.IfTransit); err != nil {
			return err
		}
	}
	return nil
}

// TunnelCounters implements Tunnels: routing has no counters.
func (*Routing) TunnelCounters(context.Context) ([]Counters, bool, error) { return nil, false, nil }
