package testbed

import (
	"fmt"
	"net/netip"
	"testing"
)

// IfSync is the link between the two nodes of a pair, for the pair's own
// traffic (state synchronisation), beside their LAN and transit links.
const IfSync = "sync0"

// The addresses of a pair (NewPairT). Gateway A's addresses of the line
// topology (GwALANV4, GwATransitV4 and their IPv6 twins) are the pair's
// virtual addresses, held by whichever node is active; each node has its
// own besides.
var (
	Node1TransitV4 = netip.MustParsePrefix("198.18.0.11/24")
	Node1TransitV6 = netip.MustParsePrefix("2001:db8::11/64")
	Node2TransitV4 = netip.MustParsePrefix("198.18.0.12/24")
	Node2TransitV6 = netip.MustParsePrefix("2001:db8::12/64")
	Node1LANV4     = netip.MustParsePrefix("198.18.1.11/24")
	Node1LANV6     = netip.MustParsePrefix("2001:db8:1::11/64")
	Node2LANV4     = netip.MustParsePrefix("198.18.1.12/24")
	Node2LANV6     = netip.MustParsePrefix("2001:db8:1::12/64")
	Node1SyncV4    = netip.MustParsePrefix("198.18.3.1/24")
	Node2SyncV4    = netip.MustParsePrefix("198.18.3.2/24")
)

// Pair is the line topology client - gwA - gwB - server with gateway A
// replaced by an active/standby pair of nodes, Node1 and Node2: their LAN
// links share LAN A with the client and their transit links share the
// transit segment with gwB, both segments bridges in a namespace of their
// own (Switch), and a direct link (IfSync) joins the two nodes. Nothing
// holds the virtual addresses (gateway A's) until a VRRP daemon (keepalived,
// see KeepalivedConf) gives them to a node. Both nodes forward; gwB routes
// LAN A and the client routes everything through the virtual addresses,
// and gwB and the server are as in the line topology.
type Pair struct {
	Client, Node1, Node2, GwB, Server, Switch *Node
	// ports are each node's LAN and transit ports on the switch.
	ports map[*Node][]string
}

// Nodes returns the pair's two nodes.
func (p *Pair) Nodes() []*Node { return []*Node{p.Node1, p.Node2} }

// NewPairT builds a Pair for a test; its namespaces go with the test
// (processes stopped, namespaces removed), also when it fails.
func NewPairT(tb testing.TB) *Pair {
	tb.Helper()
	p := &Pair{
		Client: NewNodeT(tb, "client"), Node1: NewNodeT(tb, "node1"), Node2: NewNodeT(tb, "node2"),
		GwB: NewNodeT(tb, "gwB"), Server: NewNodeT(tb, "server"), Switch: NewNodeT(tb, "switch"),
		ports: map[*Node][]string{},
	}
	all := []*Node{p.Client, p.Node1, p.Node2, p.GwB, p.Server, p.Switch}
	for _, n := range all {
		for _, kv := range [][2]string{
			{"net/ipv6/conf/all/accept_dad", "0"}, {"net/ipv6/conf/default/accept_dad", "0"},
			{"net/ipv6/conf/all/disable_ipv6", "0"}, {"net/ipv6/conf/default/disable_ipv6", "0"},
		} {
			if err := n.Sysctl(kv[0], kv[1]); err != nil {
				tb.Fatal(err)
			}
		}
		forward := "0"
		if n == p.Node1 || n == p.Node2 || n == p.GwB {
			forward = "1"
		}
		for _, key := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
			if err := n.Sysctl(key, forward); err != nil {
				tb.Fatal(err)
			}
		}
	}
	for _, br := range []string{"brlan", "brwan"} {
		p.Switch.MustIP(tb, "link", "add", br, "type", "bridge")
		p.Switch.MustIP(tb, "link", "set", br, "up")
	}
	addrs := func(n *Node, ifn string, ps ...netip.Prefix) {
		for _, a := range ps {
			args := []string{"addr", "add", a.String(), "dev", ifn}
			if a.Addr().Is6() {
				args = append(args, "nodad")
			}
			n.MustIP(tb, args...)
		}
	}
	port := 0
	plug := func(n *Node, ifn, br string, ps ...netip.Prefix) {
		port++
		sw := fmt.Sprintf("p%d", port)
		VethT(tb, n, ifn, p.Switch, sw)
		p.Switch.MustIP(tb, "link", "set", sw, "master", br)
		p.ports[n] = append(p.ports[n], sw)
		addrs(n, ifn, ps...)
	}
	plug(p.Client, IfHost, "brlan", ClientV4, ClientV6)
	plug(p.Node1, IfLAN, "brlan", Node1LANV4, Node1LANV6)
	plug(p.Node2, IfLAN, "brlan", Node2LANV4, Node2LANV6)
	plug(p.Node1, IfTransit, "brwan", Node1TransitV4, Node1TransitV6)
	plug(p.Node2, IfTransit, "brwan", Node2TransitV4, Node2TransitV6)
	plug(p.GwB, IfTransit, "brwan", GwBTransitV4, GwBTransitV6)
	VethT(tb, p.Node1, IfSync, p.Node2, IfSync)
	addrs(p.Node1, IfSync, Node1SyncV4)
	addrs(p.Node2, IfSync, Node2SyncV4)
	VethT(tb, p.GwB, IfLAN, p.Server, IfHost)
	addrs(p.GwB, IfLAN, GwBLANV4, GwBLANV6)
	addrs(p.Server, IfHost, ServerV4, ServerV6)

	p.Client.MustIP(tb, "-4", "route", "add", "default", "via", GwALANV4.Addr().String())
	p.Client.MustIP(tb, "-6", "route", "add", "default", "via", GwALANV6.Addr().String())
	p.Server.MustIP(tb, "-4", "route", "add", "default", "via", GwBLANV4.Addr().String())
	p.Server.MustIP(tb, "-6", "route", "add", "default", "via", GwBLANV6.Addr().String())
	return p
}

// RouteLANs routes LAN B through gwB on both nodes and LAN A through the
// pair's virtual transit address on gwB: plain routing, without IPsec.
func (p *Pair) RouteLANs(tb testing.TB) {
	tb.Helper()
	for _, n := range p.Nodes() {
		n.MustIP(tb, "-4", "route", "add", LANBV4.String(), "via", GwBTransitV4.Addr().String())
		n.MustIP(tb, "-6", "route", "add", LANBV6.String(), "via", GwBTransitV6.Addr().String())
	}
	p.GwB.MustIP(tb, "-4", "route", "add", LANAV4.String(), "via", GwATransitV4.Addr().String())
	p.GwB.MustIP(tb, "-6", "route", "add", LANAV6.String(), "via", GwATransitV6.Addr().String())
}

// Cut takes node's LAN and transit ports on the switch down (cut) or up
// again: the node's own links lose their carrier, as with pulled cables,
// and keep their addresses and routes. The sync link is not touched.
func (p *Pair) Cut(tb testing.TB, node *Node, cut bool) {
	tb.Helper()
	p.setPorts(tb, p.ports[node], cut)
}

// CutTransit is Cut for node's transit link alone (its uplink): its LAN
// and sync links keep their carrier.
func (p *Pair) CutTransit(tb testing.TB, node *Node, cut bool) {
	tb.Helper()
	p.setPorts(tb, p.ports[node][1:], cut) // plugged LAN first, then transit
}

func (p *Pair) setPorts(tb testing.TB, ports []string, cut bool) {
	tb.Helper()
	state := "up"
	if cut {
		state = "down"
	}
	for _, sw := range ports {
		p.Switch.MustIP(tb, "link", "set", sw, state)
	}
}
