package system

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
)

// HostToHostGroup names the host-to-host systems' rows in reports, and
// starts each of their labels: they measure the two gateways' own traffic,
// which an IPsec transport-mode association protects, not traffic between
// the LANs.
const HostToHostGroup = "host to host, transport mode"

// Endpoints are where the harness measures a system: traffic from a node
// to another, sent to an address of the latter.
type Endpoints struct {
	From, To *testbed.Node
	Dst      netip.Addr
}

// HostToHost is a System that protects the traffic of the two hosts at
// the ends of the line's transit link (gwA and gwB) to each other rather
// than the traffic between the LANs behind them: the harness measures it
// from gwA to gwB's transit address, and reports it in HostToHostGroup.
// The gateway systems do not implement it; they are measured from the
// client to the server.
type HostToHost interface {
	System
	// Endpoints returns where to measure (after Setup): gwA, gwB and
	// gwB's transit address of the run's family.
	Endpoints() Endpoints
}

// EndpointsOf returns where the harness measures s (after Setup): a
// HostToHost system's Endpoints, or, for the others, from the client to
// the server's address of family f.
func EndpointsOf(s System, f testbed.Family) Endpoints {
	if h, ok := s.(HostToHost); ok {
		return h.Endpoints()
	}
	top := s.Topology()
	return Endpoints{From: top.Client, To: top.Server, Dst: addrsOf(f).srv}
}

// Group returns the report group of s: HostToHostGroup for a HostToHost
// system, "" (the gateways') for the others.
func Group(s System) string {
	if _, ok := s.(HostToHost); ok {
		return HostToHostGroup
	}
	return ""
}

// hostLabel is the label of a host-to-host system: HostToHostGroup, then
// what carries the traffic.
func hostLabel(what string) string { return HostToHostGroup + ": " + what }

// newHostLine builds the line of a host-to-host system: a testbed line
// whose gwA and gwB lose their LAN links (the client and the server are
// left unconnected), so that each is a host with one interface and one
// address of each family, its transit address. A multi-homed host would
// measure its source address selection as well: through espd's TUN route
// (no preferred source) the kernel gives an unbound socket the address of
// the host's first interface, here gwA's LAN address, which the policy
// does not select, and espd drops the packet (held, not sent in clear).
func newHostLine(ctx context.Context, env *Env) (*testbed.Topology, error) {
	top, err := newLine(env, false)
	if err != nil {
		return nil, err
	}
	for _, n := range []*testbed.Node{top.GwA, top.GwB} {
		if _, err := n.IP(ctx, "link", "del", "dev", testbed.IfLAN); err != nil {
			return nil, errors.Join(fmt.Errorf("system: host %s: remove its LAN link: %w", n.Role, err), top.Close())
		}
	}
	return top, nil
}

// hosts is the line of a host-to-host system, and the endpoints it
// measures between.
type hosts struct {
	top *testbed.Topology
	a   addrs
}

// Endpoints implements HostToHost: gwA to gwB's transit address.
func (h *hosts) Endpoints() Endpoints {
	return Endpoints{From: h.top.GwA, To: h.top.GwB, Dst: h.a.gwB}
}

// nodes returns the two hosts, gwA and gwB.
func (h *hosts) nodes() [2]*testbed.Node { return [2]*testbed.Node{h.top.GwA, h.top.GwB} }

// Topology implements System.
func (h *hosts) Topology() *testbed.Topology { return h.top }

// HostsPlain is the host-to-host ceiling: gwA and gwB talk to each other
// over their link in the clear, no IPsec between them.
type HostsPlain struct{ hosts }

// Name implements System.
func (*HostsPlain) Name() string { return "hosts-plain" }

// Label implements System.
func (*HostsPlain) Label() string { return hostLabel("no IPsec (ceiling)") }

// PerSuite implements System.
func (*HostsPlain) PerSuite() bool { return false }

// Cipher implements System.
func (*HostsPlain) Cipher() string { return "none" }

// Available implements System.
func (*HostsPlain) Available(*Env) error { return nil }

// Setup implements System: a line of two hosts (newHostLine).
func (h *HostsPlain) Setup(ctx context.Context, env *Env) error {
	h.a = addrsOf(env.Family)
	var err error
	h.top, err = newHostLine(ctx, env)
	return err
}

// Key implements System.
func (*HostsPlain) Key(context.Context, crypto.Suite) error { return nil }

// Unkey implements System.
func (*HostsPlain) Unkey(context.Context) error { return nil }

// Gateways implements System: the kernel alone carries the traffic.
func (*HostsPlain) Gateways() (a, b []int) { return nil, nil }

// Counters implements System.
func (*HostsPlain) Counters(context.Context) (Counters, bool, error) { return Counters{}, false, nil }

// Close implements System.
func (h *HostsPlain) Close() error {
	if h.top == nil {
		return nil
	}
	return h.top.Close()
}
