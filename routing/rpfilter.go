package routing

import (
	"errors"
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

// ErrStrictRPFilter is in the error of LooseRPFilter when the filter on
// the interface stays strict.
var ErrStrictRPFilter = errors.New("strict reverse-path filtering drops what espd delivers")

// LooseRPFilter makes sure that IPv4 reverse-path filtering lets packets
// from any source in on the interface dev, which espd writes decrypted
// packets into: the kernel drops them only where max(conf/all/rp_filter,
// conf/<dev>/rp_filter) is 1 (strict). It writes 2 (loose) to dev's
// rp_filter; where that cannot be written (a read-only /proc/sys, as in
// most containers) it reads the effective value and returns nil if it is
// 0 or 2, wrote false. Otherwise the error wraps ErrStrictRPFilter and
// names the sysctl to set where /proc/sys is writable. Every rp_filter
// espd sets goes through it.
func LooseRPFilter(dev string) (wrote bool, err error) {
	werr := os.WriteFile("/proc/sys/net/ipv4/conf/"+dev+"/rp_filter", []byte("2"), 0)
	if werr == nil {
		return true, nil
	}
	all, err := readRPFilter("all")
	if err != nil {
		return false, fmt.Errorf("routing: rp_filter loose on %s: %w (and %w)", dev, werr, err)
	}
	own, err := readRPFilter(dev)
	if err != nil {
		return false, fmt.Errorf("routing: rp_filter loose on %s: %w (and %w)", dev, werr, err)
	}
	if max(all, own) != 1 {
		return false, nil
	}
	return false, fmt.Errorf("routing: %w on %s: cannot set net.ipv4.conf.%s.rp_filter=2 (%v) and all=%d, %s=%d; "+
		"where /proc/sys is writable (the host, or the container's sysctl settings), run: sysctl -w net.ipv4.conf.all.rp_filter=2",
		ErrStrictRPFilter, dev, dev, werr, all, dev, own)
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
