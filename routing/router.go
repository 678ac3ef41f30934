package routing

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ip6DefaultMetric is the metric the kernel gives an IPv6 route added
// without one (IP6_RT_PRIO_USER).
const ip6DefaultMetric = 1024

// entry is one prefix: its references and what the kernel has for it.
type entry struct {
	tunnel, throw int // references by kind
	// adoptedHold and adoptedThrow: a blackhole or throw route of a
	// previous instance that no AddRoute of its kind has claimed yet. It
	// counts as one reference of its kind that only Cleanup removes.
	adoptedHold, adoptedThrow bool

	installed   Kind // the TUN or throw route in the kernel; 0: none
	throwMetric int  // metric of the installed throw route
	held        bool // the blackhole route is in the kernel
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

func (e *entry) empty() bool {
	return e.tunnel == 0 && e.throw == 0 && !e.adoptedHold && !e.adoptedThrow && e.installed == 0 && !e.held
}

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
}

// New opens a netlink handle in the calling thread's network namespace,
// takes over what a previous instance with the same table left behind and
// sets the TUN's rp_filter to loose (2): decrypted packets arrive on the
// TUN from sources the main table routes elsewhere. The rp_filter setting
// belongs to the TUN and disappears with it.
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
	if cfg.HoldFile != "" {
		r.holdWake, r.holdDone = make(chan struct{}, 1), make(chan struct{})
		go r.holdWriter()
		r.holdWake <- struct{}{}
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
	path := "/proc/sys/net/ipv4/conf/" + r.cfg.LinkName + "/rp_filter"
	if err := os.WriteFile(path, []byte("2"), 0); err != nil {
		return fmt.Errorf("routing: rp_filter loose on %s: %w", r.cfg.LinkName, err)
	}
	return nil
}

// ruleForLoneHolds gives a family with unclaimed adopted holds and no
// rule that could send packets to them (someone removed espd's rules, and
// no hold file says whose they were) the /0 source's rule, as an adopted
// source: a hold is there to keep its prefix closed, and that is what
// espd's rule meant before the rules followed the sources.
func (r *Router) ruleForLoneHolds() error {
	for _, fam := range r.cfg.families() {
		lone := false
		for p, e := range r.routes {
			lone = lone || (e.adoptedHold && familyOf(p) == fam)
		}
		for p, s := range r.sources {
			lone = lone && !(s.adopted && familyOf(p) == fam)
		}
		if lone {
			src := anySource(fam)
			s := r.source(src)
			s.adopted = true
			if err := r.syncSource(src, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// adopt takes over the routes of Protocol a previous instance left in the
// table: blackholes and throw routes become adopted holds and throws, a
// route into a TUN becomes a hold (blackhole added, then the route
// removed), anything else is removed.
func (r *Router) adopt() error {
	for _, fam := range r.cfg.families() {
		routes, err := listOurs(r.h, &r.cfg, fam)
		if err != nil {
			return err
		}
		var dead []*netlink.Route
		for i := range routes {
			rt := &routes[i]
			p, ok := routePrefix(rt, fam)
			if !ok {
				dead = append(dead, rt)
				continue
			}
			e := r.routes[p]
			if e == nil {
				e = &entry{}
				r.routes[p] = e
			}
			switch rt.Type {
			case unix.RTN_BLACKHOLE:
				e.adoptedHold = true
				if rt.Priority == HoldMetric && !e.held {
					e.held = true
				} else {
					dead = append(dead, rt)
				}
			case unix.RTN_UNICAST:
				e.adoptedHold = true
				dead = append(dead, rt)
			case unix.RTN_THROW:
				if e.installed == Throw {
					dead = append(dead, rt)
					break
				}
				e.adoptedThrow = true
				e.installed, e.throwMetric = Throw, rt.Priority
			default:
				dead = append(dead, rt)
			}
		}
		// Holds first (sync adds them before anything else), so that
		// removing the routes they replace opens nothing.
		for p, e := range r.routes {
			if familyOf(p) == fam {
				if err := r.sync(p, e); err != nil {
					return err
				}
			}
		}
		for _, rt := range dead {
			if err := r.h.RouteDel(rt); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("routing: remove stale route %s: %w", describeRoute(rt), err)
			}
		}
	}
	for p, e := range r.routes {
		switch {
		case e.empty():
			delete(r.routes, p)
		case e.adoptedHold:
			r.adopted++
			r.unclaimed++
		case e.adoptedThrow:
			r.adopted++
		}
	}
	return nil
}

// listOurs lists the routes of Protocol in the table.
func listOurs(h *netlink.Handle, cfg *Config, fam int) ([]netlink.Route, error) {
	filter := &netlink.Route{Table: cfg.Table, Protocol: Protocol}
	routes, err := h.RouteListFiltered(fam, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("routing: list table %d: %w", cfg.Table, err)
	}
	return routes, nil
}

// routePrefix returns a listed route's destination (nil: the default
// route of fam).
func routePrefix(rt *netlink.Route, fam int) (netip.Prefix, bool) {
	if rt.Dst == nil {
		if fam == unix.AF_INET6 {
			return netip.PrefixFrom(netip.IPv6Unspecified(), 0), true
		}
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0), true
	}
	a, ok := netip.AddrFromSlice(rt.Dst.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	if fam == unix.AF_INET {
		a = a.Unmap()
	}
	ones, _ := rt.Dst.Mask.Size()
	p, err := a.Prefix(ones)
	return p, err == nil
}

func familyOf(p netip.Prefix) int {
	if p.Addr().Is6() {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// describeRoute renders a route of the table as ip-route would, roughly.
func describeRoute(rt *netlink.Route) string {
	fam := unix.AF_INET
	if rt.Dst != nil && rt.Dst.IP.To4() == nil {
		fam = unix.AF_INET6
	} else if rt.Dst == nil && rt.Family == unix.AF_INET6 {
		fam = unix.AF_INET6
	}
	p, _ := routePrefix(rt, fam)
	var s string
	switch rt.Type {
	case unix.RTN_BLACKHOLE:
		s = "blackhole " + p.String()
	case unix.RTN_THROW:
		s = "throw " + p.String()
	case unix.RTN_UNREACHABLE:
		s = "unreachable " + p.String()
	case unix.RTN_PROHIBIT:
		s = "prohibit " + p.String()
	case unix.RTN_UNICAST:
		s = p.String()
		if rt.LinkIndex > 0 {
			s += fmt.Sprintf(" dev #%d", rt.LinkIndex)
		}
	default:
		s = fmt.Sprintf("type %d %s", rt.Type, p)
	}
	s += fmt.Sprintf(" table %d proto %d", rt.Table, rt.Protocol)
	if rt.Priority != 0 {
		s += fmt.Sprintf(" metric %d", rt.Priority)
	}
	return s
}

func dst(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// mainRoute is the TUN or throw route of p. metric 0 is the kernel's
// default; deleting an IPv6 route needs it explicit, or the blackhole of
// the same prefix could be taken instead.
func (r *Router) mainRoute(p netip.Prefix, k Kind, metric int) *netlink.Route {
	rt := &netlink.Route{Dst: dst(p), Table: r.cfg.Table, Protocol: Protocol, Family: familyOf(p), Priority: metric}
	switch k {
	case Tunnel:
		rt.LinkIndex = r.cfg.LinkIndex
		rt.Scope = netlink.SCOPE_LINK
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
// reference has claimed yet: it stays closed.
func (r *Router) AddRoute(src, dst netip.Prefix, k Kind) error {
	if k != Tunnel && k != Throw {
		return fmt.Errorf("routing: unknown route kind %d", k)
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
		e.adoptedHold = false
	} else {
		e.throw++
		e.adoptedThrow = false
	}
	if err := r.sync(p, e); err != nil {
		// Back to the references before, and the kernel as close to them
		// as it goes.
		e.tunnel, e.throw, e.adoptedHold, e.adoptedThrow = saved.tunnel, saved.throw, saved.adoptedHold, saved.adoptedThrow
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
	if e == nil || (k == Tunnel && r.tunnels[key] == 0) || (k == Throw && e.throw == 0) || (k != Tunnel && k != Throw) {
		return fmt.Errorf("routing: no %s route from %s to %s", k, src, p)
	}
	rsrc, known := r.ruleSrc[key]
	if !known {
		rsrc = src
	}
	if k == Tunnel {
		e.tunnel--
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
	if want != e.installed {
		if e.installed != 0 {
			if err := r.delMain(p, e); err != nil {
				return err
			}
		}
		if want != 0 {
			if err := r.h.RouteReplace(r.mainRoute(p, want, 0)); err != nil {
				return fmt.Errorf("routing: add %s route %s table %d: %w", want, p, r.cfg.Table, err)
			}
			e.installed, e.throwMetric = want, 0
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

// delMain removes p's TUN or throw route.
func (r *Router) delMain(p netip.Prefix, e *entry) error {
	metric := 0
	if e.installed == Throw {
		metric = e.throwMetric
	}
	if err := r.h.RouteDel(r.mainRoute(p, e.installed, delMetric(p, metric))); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("routing: remove %s route %s: %w", e.installed, p, err)
	}
	e.installed, e.throwMetric = 0, 0
	return nil
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

// Cleanup removes, in the calling thread's network namespace, every rule
// that looks up cfg's table, cfg's mark rules and every route of Protocol
// in the table (holds, throw routes, routes into a TUN): all that espd
// instances with this table left behind. It is for taking espd out for
// good, with no espd running on the table; the prefixes that were held are
// open afterwards.
// It returns what it removed, one line each, as ip-rule and ip-route
// would show it. cfg.LinkIndex and cfg.LinkName are not used.
func Cleanup(cfg Config) ([]string, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("routing: netlink: %w", err)
	}
	defer h.Close()
	var done []string
	var errs []error
	for _, fam := range cfg.families() {
		// Rules first, those that look up the table before the mark
		// rules: without them nothing reaches the table.
		rules, err := h.RuleList(fam)
		if err != nil {
			errs = append(errs, fmt.Errorf("routing: list rules: %w", err))
		}
		for _, guard := range []bool{false, true} {
			for i := range rules {
				rl := &rules[i]
				var del *netlink.Rule
				switch {
				case !guard && rl.Table == cfg.Table:
					del = rl
				case guard && isJumpRule(&cfg, rl):
					del = jumpRule(&cfg, fam)
				case guard && isLandingRule(&cfg, rl):
					del = landingRule(&cfg, fam)
				default:
					continue
				}
				if err := h.RuleDel(del); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("routing: remove rule %q: %w", ruleString(rl), err))
					continue
				}
				done = append(done, "rule "+ruleString(rl))
			}
		}
		routes, err := listOurs(h, &cfg, fam)
		if err != nil {
			errs = append(errs, err)
		}
		for i := range routes {
			rt := &routes[i]
			if err := h.RouteDel(rt); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("routing: remove route %s: %w", describeRoute(rt), err))
				continue
			}
			done = append(done, "route "+describeRoute(rt))
		}
	}
	if cfg.HoldFile != "" {
		if err := os.Remove(cfg.HoldFile); err == nil {
			done = append(done, "file "+cfg.HoldFile)
		} else if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("routing: remove the hold file: %w", err))
		}
	}
	return done, errors.Join(errs...)
}

// LiveRoutes returns the routes of Protocol in cfg's table that go into a
// device that exists: a TUN route disappears with its device, and a TUN
// exists only while its process holds it open, so such a route means an
// espd using the table is running.
func LiveRoutes(cfg Config) ([]string, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("routing: netlink: %w", err)
	}
	defer h.Close()
	var live []string
	for _, fam := range cfg.families() {
		routes, err := listOurs(h, &cfg, fam)
		if err != nil {
			return nil, err
		}
		for i := range routes {
			rt := &routes[i]
			if rt.Type != unix.RTN_UNICAST || rt.LinkIndex <= 0 {
				continue
			}
			name := fmt.Sprintf("#%d", rt.LinkIndex)
			if l, err := h.LinkByIndex(rt.LinkIndex); err == nil {
				name = l.Attrs().Name
			}
			live = append(live, fmt.Sprintf("%s (dev %s)", describeRoute(rt), name))
		}
	}
	return live, nil
}
