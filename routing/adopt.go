package routing

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

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
