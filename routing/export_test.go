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
