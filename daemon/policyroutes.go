package daemon

import (
	"errors"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/espd/espd/routing"
	"github.com/espd/espd/sa"
)

var (
	errNoRouter = errors.New("daemon: no router (data plane not started)")
	any4        = netip.MustParsePrefix("0.0.0.0/0")
	any6        = netip.MustParsePrefix("::/0")
)

// routeTable is what policyRoutes needs of *routing.Router.
type routeTable interface {
	AddRoute(src, dst netip.Prefix, k routing.Kind) error
	RemoveRoute(src, dst netip.Prefix, k routing.Kind) error
}

// policyRoutes routes the traffic of outbound policies into the TUN (or,
// for bypass policies, back to the main table) through a routing.Router.
type policyRoutes struct {
	mu     sync.Mutex
	r      routeTable // nil until the router exists, and after it closed
	noIPv6 bool
	log    *slog.Logger // nil: no warnings
}

// rpChecker is what policyRoutes asks a router that can tell (a
// *routing.Router) about a transport peer's reverse-path filter.
type rpChecker interface {
	StrictRPFilter(peer netip.Addr) (string, bool, error)
}

// setRouter sets (or, with nil, clears) the router the routes go to.
func (pr *policyRoutes) setRouter(r routeTable) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.r = r
}

// policyRoute is one route reference of a policy: the destination prefix
// and the source prefix whose packets it is for.
type policyRoute struct{ src, dst netip.Prefix }

// routesOf returns the routes an outbound policy needs: its destination
// prefix (both default routes for a selector that matches any address of
// either family) with its source prefix (the default route of the
// destination's family for a selector without one), and the kind, tunnel
// for protect and drop, transport for a transport-mode protect policy
// (whole datagrams, routing.Transport), throw for bypass. The router sends to the TUN only
// packets from the sources of protect and drop policies, as the kernel's
// XFRM applies a policy only to packets from its source. Policies of other
// directions need none, and neither do those of a route-based interface
// (IfID): the administrator's routes into the interface decide.
func (pr *policyRoutes) routesOf(p sa.Policy) ([]policyRoute, routing.Kind) {
	if p.Dir != sa.DirOut || p.IfID != 0 {
		return nil, 0
	}
	kind := routing.Tunnel
	switch {
	case p.Action == sa.ActionBypass:
		kind = routing.Throw
	case p.Action == sa.ActionProtect && p.Mode == sa.ModeTransport:
		kind = routing.Transport
	}
	anyOf := func(q netip.Prefix) netip.Prefix {
		if q.Addr().Is4() {
			return any4
		}
		return any6
	}
	src, dst := p.Src.Masked(), p.Dst.Masked()
	switch {
	case p.Src.IsValid() && p.Dst.IsValid():
		return []policyRoute{{src, dst}}, kind
	case p.Dst.IsValid():
		return []policyRoute{{anyOf(dst), dst}}, kind
	case p.Src.IsValid():
		return []policyRoute{{src, anyOf(src)}}, kind
	case pr.noIPv6:
		return []policyRoute{{any4, any4}}, kind
	}
	return []policyRoute{{any4, any4}, {any6, any6}}, kind
}

// InstallPolicyRoute routes the traffic of an outbound policy: into the
// TUN for protect and drop policies, back to the main table (throw) for
// bypass policies. Routes are reference-counted per prefix, and the rules
// of protect and drop policies per source prefix, so policies that share
// a destination or a source each take their own reference. Policies of
// other directions need no route and are ignored.
//
// A protect or drop policy's prefix is also held (routing's package doc):
// if espd dies or stops, its traffic is dropped, not routed in clear,
// until the policy's owner removes it with RemovePolicyRoute.
func (pr *policyRoutes) InstallPolicyRoute(p sa.Policy) error {
	routes, kind := pr.routesOf(p)
	if len(routes) == 0 {
		return nil
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.r == nil {
		return errNoRouter
	}
	for i, rt := range routes {
		if err := pr.r.AddRoute(rt.src, rt.dst, kind); err != nil {
			for _, done := range routes[:i] {
				pr.r.RemoveRoute(done.src, done.dst, kind)
			}
			return err
		}
	}
	if kind == routing.Transport {
		pr.warnStrictRP(routes)
	}
	return nil
}

// warnStrictRP warns when a transport policy's peer is reached through an
// interface with strict reverse-path filtering, which drops the peer's
// packets once its address routes into the TUN (docs/transport.md).
func (pr *policyRoutes) warnStrictRP(routes []policyRoute) {
	rc, ok := pr.r.(rpChecker)
	if !ok || pr.log == nil {
		return
	}
	for _, rt := range routes {
		if !rt.dst.IsSingleIP() {
			continue
		}
		dev, strict, err := rc.StrictRPFilter(rt.dst.Addr())
		if err == nil && strict {
			pr.log.Warn("strict reverse-path filtering on the interface to a transport-mode peer drops its packets; set its rp_filter to 2 (loose)",
				"peer", rt.dst.Addr(), "dev", dev, "sysctl", "net.ipv4.conf."+dev+".rp_filter=2")
		}
	}
}

// RemovePolicyRoute drops the route references InstallPolicyRoute took
// for p; the last reference to a prefix releases its hold, and the last
// of a source its rule. Only the policy's owner removing it (espctl, the
// configuration file, the IKE daemon) calls it: a shutdown does not, so
// its protection outlives espd.
func (pr *policyRoutes) RemovePolicyRoute(p sa.Policy) error {
	routes, kind := pr.routesOf(p)
	if len(routes) == 0 {
		return nil
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.r == nil {
		return errNoRouter
	}
	var errs []error
	for _, rt := range routes {
		errs = append(errs, pr.r.RemoveRoute(rt.src, rt.dst, kind))
	}
	return errors.Join(errs...)
}
