package routing

import (
	"net/netip"
	"sort"
)

// Test-only API, for the external tests (package routing_test): what they
// inspect and espd does not.

// Route is one prefix's routes and references.
type Route struct {
	Prefix netip.Prefix
	// Installed is the TUN or throw route the kernel has (0: none).
	Installed Kind
	// Held: the kernel has the prefix's blackhole route.
	Held bool
	// Tunnel and Throws count the references; AdoptedHold and
	// AdoptedThrow are a previous instance's, not yet claimed.
	Tunnel, Throws            int
	AdoptedHold, AdoptedThrow bool
}

// Routes lists the prefixes the router has routes or references for, in
// prefix order.
func (r *Router) Routes() []Route {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Route, 0, len(r.routes))
	for p, e := range r.routes {
		out = append(out, Route{Prefix: p, Installed: e.installed, Held: e.held, Tunnel: e.tunnel, Throws: e.throw,
			AdoptedHold: e.adoptedHold, AdoptedThrow: e.adoptedThrow})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Prefix, out[j].Prefix
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c < 0
		}
		return a.Bits() < b.Bits()
	})
	return out
}

// Mark returns the fwmark espd's outer sockets must carry.
func (r *Router) Mark() uint32 { return r.cfg.Mark }

// Source is one source prefix's rule and references.
type Source struct {
	Prefix netip.Prefix
	// Refs counts the Tunnel references; Adopted: a previous instance's
	// rule or a recorded source; Installed: the rule is in the kernel.
	Refs               int
	Adopted, Installed bool
}

// Sources lists the sources the router has rules or references for, in
// prefix order.
func (r *Router) Sources() []Source {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Source, 0, len(r.sources))
	for p, s := range r.sources {
		out = append(out, Source{Prefix: p, Refs: s.refs, Adopted: s.adopted, Installed: s.installed})
	}
	sort.Slice(out, func(i, j int) bool { return comparePrefix(out[i].Prefix, out[j].Prefix) < 0 })
	return out
}
