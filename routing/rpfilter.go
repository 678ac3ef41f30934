package routing

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
)

// StrictRPFilter reports whether IPv4 packets from the address peer that
// arrive on the interface espd's own packets to it leave by (the marked
// route, as PathMTU finds it) meet strict reverse-path filtering: the
// kernel applies the larger of net.ipv4.conf.all.rp_filter and the
// interface's own, and 1 is strict. A Transport route sends the host's
// packets to peer into the TUN, so a strict filter on that interface
// drops the peer's ARP and ESP (their reverse route is the TUN): loose
// mode (2) on the interface, or none, lets them in. It returns the
// interface's name. IPv6 has no such filter; it reports false for it.
func (r *Router) StrictRPFilter(peer netip.Addr) (string, bool, error) {
	if !peer.Is4() {
		return "", false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return "", false, ErrClosed
	}
	routes, err := r.h.RouteGetWithOptions(peer.AsSlice(), &netlink.RouteGetOptions{Mark: r.cfg.Mark})
	if err != nil {
		return "", false, fmt.Errorf("routing: route to %s: %w", peer, err)
	}
	if len(routes) == 0 {
		return "", false, fmt.Errorf("routing: no route to %s", peer)
	}
	link, err := r.h.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return "", false, fmt.Errorf("routing: link of route to %s: %w", peer, err)
	}
	name := link.Attrs().Name
	all, err := readRPFilter("all")
	if err != nil {
		return name, false, err
	}
	dev, err := readRPFilter(name)
	if err != nil {
		return name, false, err
	}
	return name, max(all, dev) == 1, nil
}

// readRPFilter reads net.ipv4.conf.<conf>.rp_filter.
func readRPFilter(conf string) (int, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + conf + "/rp_filter")
	if err != nil {
		return 0, fmt.Errorf("routing: %w", err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("routing: rp_filter of %s: %w", conf, err)
	}
	return v, nil
}
