package routing

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrClosed is the error of a Router's methods after Close.
var ErrClosed = errors.New("routing: router closed")

// Router owns espd's routes and rules in one network namespace. Its
// methods are safe for concurrent use.
type Router struct {
	cfg Config
	h   *netlink.Handle

	mu     sync.Mutex
	routes map[netip.Prefix]*entry
	// tunnels counts the Tunnel references by source and destination;
	// ruleSrc is the source whose rule they take (ruleSourceFor, decided
	// at the pair's first reference).
	tunnels map[pair]int
	ruleSrc map[pair]netip.Prefix
	sources map[netip.Prefix]*source
	guards  map[int]guard // by family
	narrow  map[int]int   // installed rules of sources other than /0, by family
	// unclaimed counts the adopted holds no Tunnel reference has
	// claimed; adopted sources keep their rules while it is not 0.
	unclaimed int
	// untidy: a rule may be in the kernel that is no longer wanted
	// (tidyRules).
	untidy  bool
	adopted int
	closed  bool
	// added, if set, collects the rules added (RestoreHolds).
	added *[]string

	holdWake chan struct{} // holdsChanged to holdWriter; nil without HoldFile
	holdDone chan struct{} // closed when holdWriter returns
	addrDone chan struct{} // closed by Close: ends watchAddrs's subscription
}

// New opens a netlink handle in the calling thread's network namespace,
// takes over what a previous instance with the same table left behind and
// sets the TUN's rp_filter to loose (2): decrypted packets arrive on the
// TUN from sources the main table routes elsewhere. The rp_filter setting
// belongs to the TUN and disappears with it. Where /proc/sys is read-only
// New fails only if the filter on the TUN is strict (LooseRPFilter).
//
// Rules identical to its own are kept (duplicates removed, one always
// stays), so a held prefix's traffic never bypasses the table, not even
// for a moment; they stay while a hold is adopted and unclaimed, and go
// once none is and no Tunnel reference claims their source. A family
// whose adopted holds no rule of ours could reach (its rules were removed
// by hand, and the hold file does not list their sources) gets the /0
// source's rule, adopted: a hold must keep its prefix closed. The previous
// instance's blackhole and throw routes are adopted (Adopted, Routes); a
// route of its into a TUN that still exists becomes a hold; any other
// route of Protocol in the table is removed.
func New(cfg Config) (*Router, error) {
	if cfg.LinkIndex <= 0 || cfg.LinkName == "" {
		return nil, errors.New("routing: TUN link index and name required")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("routing: netlink: %w", err)
	}
	r := newRouter(cfg, h)
	if err := r.init(); err != nil {
		r.Close()
		return nil, err
	}
	if err := r.watchAddrs(); err != nil {
		r.Close()
		return nil, err
	}
	if cfg.HoldFile != "" {
		if err := r.startHoldWriter(); err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}

// pair is a Tunnel reference's source and destination.
type pair struct{ src, dst netip.Prefix }

func newRouter(cfg Config, h *netlink.Handle) *Router {
	return &Router{cfg: cfg, h: h, routes: make(map[netip.Prefix]*entry), tunnels: make(map[pair]int), ruleSrc: make(map[pair]netip.Prefix),
		sources: make(map[netip.Prefix]*source), guards: make(map[int]guard), narrow: make(map[int]int)}
}

// init adopts the rules and routes a previous instance left, holds what
// the hold file lists, gives every narrow source its family's mark rules
// and removes the adopted rules that nothing held needs.
func (r *Router) init() error {
	if err := r.adoptRules(); err != nil {
		return err
	}
	if err := r.adopt(); err != nil {
		return err
	}
	if err := r.restoreFromFile(); err != nil {
		return err
	}
	if err := r.ruleForLoneHolds(); err != nil {
		return err
	}
	r.untidy = true
	if err := r.tidyRules(); err != nil {
		return err
	}
	for _, fam := range r.cfg.families() {
		if r.narrow[fam] > 0 {
			if err := r.ensureGuard(fam); err != nil {
				return err
			}
		}
	}
	_, err := LooseRPFilter(r.cfg.LinkName)
	return err
}

// AddRoute takes a reference on the route of kind k to the destination
// prefix dst, for packets from the source prefix src (0.0.0.0/0 or ::/0
// for a policy without one; the family of dst). The first reference
// installs the route; a Tunnel reference first takes a reference on src's
// rule (see the package doc), then holds the prefix and claims a hold
// adopted from a previous instance, a Throw reference takes no rule and
// claims an adopted throw route. A prefix referenced by both kinds routes
// into the TUN: a protect policy must not leak because a bypass policy
// with a narrower selector shares its destination prefix. For the same
// reason a bypass cannot open a prefix whose adopted hold no Tunnel
// reference has claimed yet: it stays closed. A Transport reference is a
// Tunnel reference whose prefix's TUN route, while it lasts, carries the
// transport attributes (Kind Transport); it is removed as Transport.
func (r *Router) AddRoute(src, dst netip.Prefix, k Kind) error {
	if k != Tunnel && k != Throw && k != Transport {
		return fmt.Errorf("routing: unknown route kind %d", k)
	}
	transport := k == Transport
	if transport {
		k = Tunnel
	}
	src, p, err := r.checkPrefixes(src, dst)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	var s *source
	key := pair{src, p}
	rsrc, known := r.ruleSrc[key]
	if k == Tunnel {
		if !known {
			rsrc = r.ruleSourceFor(src)
		}
		s = r.source(rsrc)
		s.refs++
		if err := r.syncSource(rsrc, s); err != nil {
			s.refs--
			r.syncSource(rsrc, s)
			return err
		}
	}
	e := r.routes[p]
	if e == nil {
		e = &entry{}
	}
	saved := *e
	if k == Tunnel {
		e.tunnel++
		if transport {
			e.transport++
			if src.IsSingleIP() {
				if e.trSrcs == nil {
					e.trSrcs = map[netip.Addr]int{}
				}
				e.trSrcs[src.Addr()]++
			}
		}
		e.adoptedHold = false
	} else {
		e.throw++
		e.adoptedThrow = false
	}
	if err := r.sync(p, e); err != nil {
		// Back to the references before, and the kernel as close to them
		// as it goes.
		e.tunnel, e.transport, e.throw, e.adoptedHold, e.adoptedThrow = saved.tunnel, saved.transport, saved.throw, saved.adoptedHold, saved.adoptedThrow
		if transport && src.IsSingleIP() {
			e.dropTrSrc(src.Addr())
		}
		r.sync(p, e)
		if e.empty() {
			delete(r.routes, p)
		} else {
			r.routes[p] = e
		}
		if s != nil {
			s.refs--
			r.syncSource(rsrc, s)
		}
		return err
	}
	r.routes[p] = e
	if k == Tunnel {
		r.tunnels[key]++
		r.ruleSrc[key] = rsrc
		if saved.adoptedHold {
			r.unclaimed--
			if r.unclaimed == 0 {
				r.untidy = true
			}
		}
	}
	// The reference is taken; a rule that could not be removed yet is
	// tried again with the next change (and by Close).
	r.tidyRules()
	r.holdsChanged()
	return nil
}

// checkPrefixes checks a reference's source and destination and returns
// them masked.
func (r *Router) checkPrefixes(src, dst netip.Prefix) (netip.Prefix, netip.Prefix, error) {
	if !src.IsValid() || !dst.IsValid() {
		return src, dst, errors.New("routing: invalid prefix")
	}
	for _, p := range []netip.Prefix{src, dst} {
		if p.Addr().Is4In6() {
			return src, dst, fmt.Errorf("routing: IPv4-mapped prefix %s", p)
		}
		if r.cfg.NoIPv6 && p.Addr().Is6() {
			return src, dst, fmt.Errorf("routing: IPv6 prefix %s with IPv6 disabled", p)
		}
	}
	if src.Addr().Is4() != dst.Addr().Is4() {
		return src, dst, fmt.Errorf("routing: source %s and destination %s of different families", src, dst)
	}
	return src.Masked(), dst.Masked(), nil
}

// RemoveRoute drops a reference AddRoute took; the last one removes the
// route (or turns a shared prefix's route into the other kind) and then
// the prefix's hold, and the last Tunnel reference of a source removes its
// rule after that. This is the only way, besides Cleanup, that a hold
// goes: the owner of a policy removed it.
func (r *Router) RemoveRoute(src, dst netip.Prefix, k Kind) error {
	src, p, err := r.checkPrefixes(src, dst)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	e := r.routes[p]
	key := pair{src, p}
	asked := k
	transport := k == Transport
	if transport {
		k = Tunnel
	}
	if e == nil || (k == Tunnel && r.tunnels[key] == 0) || (transport && e.transport == 0) || (k == Throw && e.throw == 0) || (k != Tunnel && k != Throw) {
		return fmt.Errorf("routing: no %s route from %s to %s", asked, src, p)
	}
	rsrc, known := r.ruleSrc[key]
	if !known {
		rsrc = src
	}
	if k == Tunnel {
		e.tunnel--
		if transport {
			e.transport--
			if src.IsSingleIP() {
				e.dropTrSrc(src.Addr())
			}
		}
		if r.tunnels[key]--; r.tunnels[key] == 0 {
			delete(r.tunnels, key)
			delete(r.ruleSrc, key)
		}
	} else {
		e.throw--
	}
	err = r.sync(p, e)
	if e.empty() {
		delete(r.routes, p)
	}
	if k == Tunnel {
		s := r.sources[rsrc]
		s.refs--
		err = errors.Join(err, r.syncSource(rsrc, s))
	}
	r.tidyRules()
	r.holdsChanged()
	return err
}

// Adopted returns how many prefixes New took over, held or thrown, from a
// previous instance.
func (r *Router) Adopted() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.adopted
}

// Table returns the routing table in use.
func (r *Router) Table() int { return r.cfg.Table }

// PathMTU returns the MTU of the route an outer packet to dst (marked, so
// routed by the main table) takes: the route's mtu attribute if it has
// one, else the outgoing interface's MTU. After Close it fails.
func (r *Router) PathMTU(dst netip.Addr) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, ErrClosed
	}
	routes, err := r.h.RouteGetWithOptions(dst.AsSlice(), &netlink.RouteGetOptions{Mark: r.cfg.Mark})
	if err != nil {
		return 0, fmt.Errorf("routing: route to %s: %w", dst, err)
	}
	if len(routes) == 0 {
		return 0, fmt.Errorf("routing: no route to %s", dst)
	}
	if routes[0].MTU > 0 {
		return routes[0].MTU, nil
	}
	link, err := r.h.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return 0, fmt.Errorf("routing: link of route to %s: %w", dst, err)
	}
	return link.Attrs().MTU, nil
}

// Close is the orderly stop: it removes the routes into the TUN and
// closes the netlink handle. While any prefix is held (a protect or drop
// policy was installed and not removed by its owner, or a hold adopted
// from a previous instance was not claimed) it keeps the holds, the throw
// routes and every rule, so that the prefixes stay closed and the
// bypasses open while espd is away; with nothing held it removes the
// throw routes and the rules too and leaves nothing behind. With
// Config.HoldFile it records the sources and prefixes it leaves held there
// before it returns (a failure goes to Config.HoldFileError: the kernel's
// holds are unaffected). It tries everything and returns the failures
// joined.
func (r *Router) Close() error {
	held, first, err := r.close()
	if first && r.holdWake != nil {
		close(r.holdWake)
		<-r.holdDone
		if werr := writeHoldFile(r.cfg.HoldFile, held); werr != nil && r.cfg.HoldFileError != nil {
			r.cfg.HoldFileError(werr)
		}
	}
	return err
}

// close does Close's work on the kernel and returns what is held; first
// is false when r was closed already.
func (r *Router) close() (held holdSet, first bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return holdSet{}, false, nil
	}
	r.closed = true
	if r.addrDone != nil {
		close(r.addrDone)
	}
	held = r.heldSet()
	var errs []error
	keep := false
	for p, e := range r.routes {
		if e.installed == Tunnel {
			if err := r.delMain(p, e); err != nil {
				errs = append(errs, err)
			}
		}
		keep = keep || e.held
	}
	if !keep {
		for p, e := range r.routes {
			if e.installed != 0 {
				if err := r.delMain(p, e); err != nil {
					errs = append(errs, err)
				}
			}
		}
		errs = append(errs, r.removeRules()...)
		held = holdSet{}
	}
	r.routes = nil
	r.sources = nil
	r.h.Close()
	return held, true, errors.Join(errs...)
}
