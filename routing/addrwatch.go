package routing

import (
	"fmt"

	"github.com/vishvananda/netlink"
)

// watchAddrs follows the host's address changes and re-installs the
// Transport routes after each: a route's preferred source must be an
// address the host holds, so one that was missing when the route went in
// is named once it appears, and the kernel, which deletes IPv4 routes
// whose preferred source goes away (an interface taken down and up, a new
// DHCP lease), gets the route back at once. Until then the prefix's hold
// keeps its traffic from leaving in clear. The subscription is in the
// calling thread's network namespace; Close ends it (its reader returns
// at the next netlink message).
func (r *Router) watchAddrs() error {
	ch := make(chan netlink.AddrUpdate, 64)
	r.addrDone = make(chan struct{})
	if err := netlink.AddrSubscribeWithOptions(ch, r.addrDone, netlink.AddrSubscribeOptions{}); err != nil {
		return fmt.Errorf("routing: follow address changes: %w", err)
	}
	go func() {
		for range ch {
			// A burst of changes (an interface's addresses) is one
			// re-install.
			for drained := false; !drained; {
				select {
				case _, ok := <-ch:
					if !ok {
						return
					}
				default:
					drained = true
				}
			}
			r.resyncTransport()
		}
	}()
	return nil
}

// resyncTransport re-installs every Transport route with the preferred
// source it wants, or none if the host does not hold it.
func (r *Router) resyncTransport() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	for p, e := range r.routes {
		if e.installed != Tunnel || !e.installedTr {
			continue
		}
		if src, err := r.replaceMain(p, Transport, e.prefSrc()); err == nil {
			e.installedSrc = src
		}
	}
}
