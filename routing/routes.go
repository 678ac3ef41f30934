package routing

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ip6DefaultMetric is the metric the kernel gives an IPv6 route added
// without one (IP6_RT_PRIO_USER).
const ip6DefaultMetric = 1024

// entry is one prefix: its references and what the kernel has for it.
type entry struct {
	tunnel, throw int // references by kind (Transport ones counted in tunnel)
	transport     int // the Transport references among tunnel
	// adoptedHold and adoptedThrow: a blackhole or throw route of a
	// previous instance that no AddRoute of its kind has claimed yet. It
	// counts as one reference of its kind that only Cleanup removes.
	adoptedHold, adoptedThrow bool

	// trSrcs counts the Transport references by their source when it is
	// one address: the host's own address, which its Transport route
	// names as the preferred source.
	trSrcs map[netip.Addr]int

	installed    Kind       // the TUN or throw route in the kernel; 0: none
	installedTr  bool       // the TUN route in the kernel is a Transport one
	installedSrc netip.Addr // its preferred source; invalid: none
	throwMetric  int        // metric of the installed throw route
	held         bool       // the blackhole route is in the kernel
}

// wantHold reports whether the prefix must be held.
func (e *entry) wantHold() bool { return e.tunnel > 0 || e.adoptedHold }

// want is the TUN or throw route the kernel should have. A hold without a
// tunnel reference (adopted) keeps the prefix closed: a throw route would
// win over the blackhole and open it.
func (e *entry) want() Kind {
	switch {
	case e.tunnel > 0:
		return Tunnel
	case e.wantHold():
		return 0
	case e.throw > 0 || e.adoptedThrow:
		return Throw
	}
	return 0
}

// prefSrc is the preferred source a Transport route of e names: the
// lowest of its Transport references' single-address sources.
func (e *entry) prefSrc() netip.Addr {
	var best netip.Addr
	for a := range e.trSrcs {
		if !best.IsValid() || a.Less(best) {
			best = a
		}
	}
	return best
}

// dropTrSrc drops one Transport reference of the source a.
func (e *entry) dropTrSrc(a netip.Addr) {
	if e.trSrcs[a]--; e.trSrcs[a] <= 0 {
		delete(e.trSrcs, a)
	}
}

func (e *entry) empty() bool {
	return e.tunnel == 0 && e.throw == 0 && !e.adoptedHold && !e.adoptedThrow && e.installed == 0 && !e.held
}

func familyOf(p netip.Prefix) int {
	if p.Addr().Is6() {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

func dst(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// mainRoute is the TUN or throw route of p. metric 0 is the kernel's
// default; deleting an IPv6 route needs it explicit, or the blackhole of
// the same prefix could be taken instead. A Transport route is the TUN
// route with a locked MTU, an advertised MSS and, if valid, the preferred
// source src: the TUN has no address of its own, and without it the host
// would pick any of its addresses for its packets to the peer, not the
// one the transport policy names.
func (r *Router) mainRoute(p netip.Prefix, k Kind, metric int, src netip.Addr) *netlink.Route {
	rt := &netlink.Route{Dst: dst(p), Table: r.cfg.Table, Protocol: Protocol, Family: familyOf(p), Priority: metric}
	switch k {
	case Tunnel, Transport:
		rt.LinkIndex = r.cfg.LinkIndex
		rt.Scope = netlink.SCOPE_LINK
		if k == Transport {
			rt.MTU, rt.MTULock = r.cfg.TransportMTU, true
			if src.IsValid() {
				rt.Src = src.AsSlice()
			}
			rt.AdvMSS = r.cfg.MTU - 20 - 20
			if p.Addr().Is6() {
				rt.AdvMSS -= 20
			}
		}
	case Throw:
		rt.Type = unix.RTN_THROW
	}
	return rt
}

// delMetric is the metric to delete p's TUN or throw route with.
func delMetric(p netip.Prefix, metric int) int {
	if metric == 0 && p.Addr().Is6() {
		return ip6DefaultMetric
	}
	return metric
}

// holdRoute is the blackhole route that holds p.
func (r *Router) holdRoute(p netip.Prefix) *netlink.Route {
	return &netlink.Route{Dst: dst(p), Table: r.cfg.Table, Protocol: Protocol, Family: familyOf(p),
		Type: unix.RTN_BLACKHOLE, Priority: HoldMetric}
}

// sync makes the kernel's routes for p match e's references, in an order
// that never leaves a prefix that should be held or routed into the TUN
// without one of the two: the hold goes in first and comes out last.
func (r *Router) sync(p netip.Prefix, e *entry) error {
	wantHold, want := e.wantHold(), e.want()
	if wantHold && !e.held {
		if err := r.h.RouteReplace(r.holdRoute(p)); err != nil {
			return fmt.Errorf("routing: hold %s with a blackhole route in table %d: %w", p, r.cfg.Table, err)
		}
		e.held = true
	}
	wantTr := want == Tunnel && e.transport > 0
	var wantSrc netip.Addr
	if wantTr {
		wantSrc = e.prefSrc()
	}
	if want == Tunnel && e.installed == Tunnel && (wantTr != e.installedTr || wantSrc != e.installedSrc) {
		// The same route with or without the transport attributes, or
		// with another source: replaced in place, never absent.
		src, err := r.replaceMain(p, routeKind(want, wantTr), wantSrc)
		if err != nil {
			return fmt.Errorf("routing: change %s route %s table %d: %w", routeKind(want, wantTr), p, r.cfg.Table, err)
		}
		e.installedTr, e.installedSrc = wantTr, src
	}
	if want != e.installed {
		if e.installed != 0 {
			if err := r.delMain(p, e); err != nil {
				return err
			}
		}
		if want != 0 {
			src, err := r.replaceMain(p, routeKind(want, wantTr), wantSrc)
			if err != nil {
				return fmt.Errorf("routing: add %s route %s table %d: %w", routeKind(want, wantTr), p, r.cfg.Table, err)
			}
			e.installed, e.installedTr, e.installedSrc, e.throwMetric = want, wantTr, src, 0
		}
	}
	if !wantHold && e.held {
		if err := r.h.RouteDel(r.holdRoute(p)); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("routing: remove the hold of %s: %w", p, err)
		}
		e.held = false
	}
	return nil
}

// replaceMain installs p's route of kind k with the preferred source src
// and returns the source installed. An address the host does not hold
// (yet) is refused by the kernel as a preferred source: the route then
// goes in without one, and the host's packets whose source is not the
// policy's find no state in espd (dropped, never sent in clear).
func (r *Router) replaceMain(p netip.Prefix, k Kind, src netip.Addr) (netip.Addr, error) {
	err := r.h.RouteReplace(r.mainRoute(p, k, 0, src))
	if err != nil && src.IsValid() && errors.Is(err, unix.EINVAL) {
		src = netip.Addr{}
		err = r.h.RouteReplace(r.mainRoute(p, k, 0, src))
	}
	return src, err
}

// delMain removes p's TUN or throw route.
func (r *Router) delMain(p netip.Prefix, e *entry) error {
	metric := 0
	if e.installed == Throw {
		metric = e.throwMetric
	}
	if err := r.h.RouteDel(r.mainRoute(p, routeKind(e.installed, e.installedTr), delMetric(p, metric), e.installedSrc)); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("routing: remove %s route %s: %w", e.installed, p, err)
	}
	e.installed, e.installedTr, e.installedSrc, e.throwMetric = 0, false, netip.Addr{}, 0
	return nil
}

// routeKind is the kind of the route the kernel gets for want: Transport
// for a TUN route with transport references.
func routeKind(want Kind, transport bool) Kind {
	if want == Tunnel && transport {
		return Transport
	}
	return want
}
