// Package routing installs, and removes again, what espd puts into the
// kernel's routing: routes that steer the traffic of outbound policies into
// the TUN device, and the policy-routing rules that keep espd's own outer
// packets out of it.
//
// The routes live in a dedicated table (Config.Table). For a protect or
// drop policy the table gets a route to the policy's destination prefix
// through the TUN; for a bypass policy it gets a throw route, which ends
// the lookup in this table so that the kernel continues with the next rule
// (usually the main table). One rule per address family,
//
//	not fwmark <Mark>/<Mask> lookup <Table>
//
// sends everything except packets marked with Mark to the table. espd
// marks its outer sockets with SO_MARK Mark, so its ESP packets are routed
// by the main table even when a policy covers 0.0.0.0/0 or ::/0, the
// peer's own address included, and never loop back into the TUN.
//
// Routes select on the destination prefix only. A policy that also narrows
// the source, protocol or ports routes all traffic to its destination into
// the TUN, where the data plane applies the full selector.
package routing

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Defaults for Config.
const (
	// DefaultTable is the routing table espd's routes go into.
	DefaultTable = 0xe5d0
	// DefaultMark is the fwmark (SO_MARK) of espd's outer packets.
	DefaultMark = 0xe5d0
	// DefaultPriority is the preference of espd's rules: before the main
	// table (32766), after the local table (0).
	DefaultPriority = 0xe5d
	// Protocol tags every route espd installs (rtnetlink protocol field),
	// so that "ip route show proto 229" lists them and New can remove the
	// leftovers of a previous instance that did not exit cleanly.
	Protocol = 229
)

// Kind is what a prefix's route in the table does.
type Kind uint8

const (
	// Tunnel routes the prefix into the TUN: protect and drop policies.
	Tunnel Kind = iota + 1
	// Throw ends the lookup in the table so the main table decides:
	// bypass policies.
	Throw
)

// String names the kind as ip-route does.
func (k Kind) String() string {
	switch k {
	case Tunnel:
		return "tunnel"
	case Throw:
		return "throw"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Config says where the routes and rules go.
type Config struct {
	// LinkIndex and LinkName identify the TUN device.
	LinkIndex int
	LinkName  string
	// Table is the routing table for espd's routes; 0 means DefaultTable.
	Table int
	// Mark and Mask: packets with mark&Mask == Mark skip the table.
	// Mark 0 means DefaultMark; Mask 0 means 0xffffffff.
	Mark, Mask uint32
	// Priority of the rules; 0 means DefaultPriority.
	Priority int
	// NoIPv6 leaves out the IPv6 rule and refuses IPv6 prefixes.
	NoIPv6 bool
}

type entry struct {
	tunnel, throw int  // references by kind
	installed     Kind // what the kernel has now; 0: nothing
}

// Router owns espd's routes and rules in one network namespace. Its
// methods are safe for concurrent use.
type Router struct {
	cfg Config
	h   *netlink.Handle

	mu     sync.Mutex
	routes map[netip.Prefix]*entry
	rules  []*netlink.Rule
	closed bool
}

// New opens a netlink handle in the calling thread's network namespace,
// removes what a previous instance with the same table left behind, adds
// the rules and sets the TUN's rp_filter to loose (2): decrypted packets
// arrive on the TUN from sources the main table routes elsewhere. The
// rp_filter setting belongs to the TUN and disappears with it.
func New(cfg Config) (*Router, error) {
	if cfg.LinkIndex <= 0 || cfg.LinkName == "" {
		return nil, errors.New("routing: TUN link index and name required")
	}
	if cfg.Table == 0 {
		cfg.Table = DefaultTable
	}
	if cfg.Table == unix.RT_TABLE_MAIN || cfg.Table == unix.RT_TABLE_LOCAL || cfg.Table == unix.RT_TABLE_DEFAULT || cfg.Table < 0 {
		return nil, fmt.Errorf("routing: table %d is reserved", cfg.Table)
	}
	if cfg.Mark == 0 {
		cfg.Mark = DefaultMark
	}
	if cfg.Mask == 0 {
		cfg.Mask = 0xffffffff
	}
	if cfg.Mark&cfg.Mask != cfg.Mark {
		return nil, fmt.Errorf("routing: mark %#x has bits outside mask %#x", cfg.Mark, cfg.Mask)
	}
	if cfg.Priority == 0 {
		cfg.Priority = DefaultPriority
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("routing: netlink: %w", err)
	}
	r := &Router{cfg: cfg, h: h, routes: make(map[netip.Prefix]*entry)}
	if err := r.init(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Router) families() []int {
	if r.cfg.NoIPv6 {
		return []int{unix.AF_INET}
	}
	return []int{unix.AF_INET, unix.AF_INET6}
}

func (r *Router) rule(family int) *netlink.Rule {
	rule := netlink.NewRule()
	rule.Family = family
	rule.Table = r.cfg.Table
	rule.Priority = r.cfg.Priority
	rule.Mark = r.cfg.Mark
	mask := r.cfg.Mask
	rule.Mask = &mask
	rule.Invert = true
	return rule
}

func (r *Router) init() error {
	if err := r.flushStale(); err != nil {
		return err
	}
	for _, fam := range r.families() {
		rule := r.rule(fam)
		if err := r.h.RuleAdd(rule); err != nil {
			return fmt.Errorf("routing: add rule %q: %w", ruleString(rule), err)
		}
		r.rules = append(r.rules, rule)
	}
	path := "/proc/sys/net/ipv4/conf/" + r.cfg.LinkName + "/rp_filter"
	if err := os.WriteFile(path, []byte("2"), 0); err != nil {
		return fmt.Errorf("routing: rp_filter loose on %s: %w", r.cfg.LinkName, err)
	}
	return nil
}

// flushStale removes rules identical to ours and routes tagged Protocol in
// our table: the state of an instance that died without Close.
func (r *Router) flushStale() error {
	for _, fam := range r.families() {
		for range 100 { // identical rules may have been added several times
			if err := r.h.RuleDel(r.rule(fam)); err != nil {
				break
			}
		}
		filter := &netlink.Route{Table: r.cfg.Table, Protocol: Protocol}
		routes, err := r.h.RouteListFiltered(fam, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return fmt.Errorf("routing: list table %d: %w", r.cfg.Table, err)
		}
		for i := range routes {
			if err := r.h.RouteDel(&routes[i]); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("routing: remove stale route %s: %w", routes[i].Dst, err)
			}
		}
	}
	return nil
}

func ruleString(r *netlink.Rule) string {
	fam := "inet"
	if r.Family == unix.AF_INET6 {
		fam = "inet6"
	}
	return fmt.Sprintf("%s pref %d not fwmark %#x/%#x lookup %d", fam, r.Priority, r.Mark, *r.Mask, r.Table)
}

func (r *Router) kernelRoute(p netip.Prefix, k Kind) *netlink.Route {
	rt := &netlink.Route{
		Dst:      &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())},
		Table:    r.cfg.Table,
		Protocol: Protocol,
		Family:   unix.AF_INET,
	}
	if p.Addr().Is6() {
		rt.Family = unix.AF_INET6
	}
	switch k {
	case Tunnel:
		rt.LinkIndex = r.cfg.LinkIndex
		rt.Scope = netlink.SCOPE_LINK
	case Throw:
		rt.Type = unix.RTN_THROW
	}
	return rt
}

// AddRoute takes a reference on the route of kind k to prefix p. The first
// reference installs it. A prefix referenced by both kinds routes into the
// TUN: a protect policy must not leak because a bypass policy with a
// narrower selector shares its destination prefix.
func (r *Router) AddRoute(p netip.Prefix, k Kind) error {
	if !p.IsValid() {
		return errors.New("routing: invalid prefix")
	}
	if k != Tunnel && k != Throw {
		return fmt.Errorf("routing: unknown route kind %d", k)
	}
	if p.Addr().Is4In6() {
		return fmt.Errorf("routing: IPv4-mapped prefix %s", p)
	}
	if r.cfg.NoIPv6 && p.Addr().Is6() {
		return fmt.Errorf("routing: IPv6 prefix %s with IPv6 disabled", p)
	}
	p = p.Masked()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("routing: router closed")
	}
	e := r.routes[p]
	if e == nil {
		e = &entry{}
	}
	if k == Tunnel {
		e.tunnel++
	} else {
		e.throw++
	}
	if err := r.sync(p, e); err != nil {
		if k == Tunnel {
			e.tunnel--
		} else {
			e.throw--
		}
		return err
	}
	r.routes[p] = e
	return nil
}

// RemoveRoute drops a reference AddRoute took; the last one removes the
// route (or turns a shared prefix's route into the other kind).
func (r *Router) RemoveRoute(p netip.Prefix, k Kind) error {
	if !p.IsValid() {
		return errors.New("routing: invalid prefix")
	}
	p = p.Masked()
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.routes[p]
	if e == nil || (k == Tunnel && e.tunnel == 0) || (k == Throw && e.throw == 0) || (k != Tunnel && k != Throw) {
		return fmt.Errorf("routing: no %s route to %s", k, p)
	}
	if k == Tunnel {
		e.tunnel--
	} else {
		e.throw--
	}
	err := r.sync(p, e)
	if e.installed == 0 && e.tunnel == 0 && e.throw == 0 {
		delete(r.routes, p)
	}
	return err
}

// want is the kind the kernel should have for e.
func (e *entry) want() Kind {
	switch {
	case e.tunnel > 0:
		return Tunnel
	case e.throw > 0:
		return Throw
	}
	return 0
}

// sync makes the kernel's route for p match e's references.
func (r *Router) sync(p netip.Prefix, e *entry) error {
	want := e.want()
	if want == e.installed {
		return nil
	}
	if want == 0 {
		if err := r.h.RouteDel(r.kernelRoute(p, e.installed)); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("routing: remove %s route %s: %w", e.installed, p, err)
		}
		e.installed = 0
		return nil
	}
	if e.installed != 0 {
		// A throw route and a unicast route to the same prefix cannot be
		// replaced in place (different types); remove, then add.
		if err := r.h.RouteDel(r.kernelRoute(p, e.installed)); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("routing: remove %s route %s: %w", e.installed, p, err)
		}
		e.installed = 0
	}
	if err := r.h.RouteReplace(r.kernelRoute(p, want)); err != nil {
		return fmt.Errorf("routing: add %s route %s table %d: %w", want, p, r.cfg.Table, err)
	}
	e.installed = want
	return nil
}

// Route is one prefix's installed route and its references.
type Route struct {
	Prefix         netip.Prefix
	Installed      Kind
	Tunnel, Throws int
}

// Routes lists the prefixes the router holds references for.
func (r *Router) Routes() []Route {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Route, 0, len(r.routes))
	for p, e := range r.routes {
		out = append(out, Route{Prefix: p, Installed: e.installed, Tunnel: e.tunnel, Throws: e.throw})
	}
	return out
}

// Table returns the routing table in use.
func (r *Router) Table() int { return r.cfg.Table }

// Mark returns the fwmark espd's outer sockets must carry.
func (r *Router) Mark() uint32 { return r.cfg.Mark }

// PathMTU returns the MTU of the route an outer packet to dst (marked, so
// routed by the main table) takes: the route's mtu attribute if it has
// one, else the outgoing interface's MTU.
func (r *Router) PathMTU(dst netip.Addr) (int, error) {
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

// Close removes every route and rule the router added and closes its
// netlink handle. It tries everything and returns the failures joined.
func (r *Router) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	var errs []error
	for p, e := range r.routes {
		if e.installed != 0 {
			if err := r.h.RouteDel(r.kernelRoute(p, e.installed)); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("routing: remove %s route %s: %w", e.installed, p, err))
			}
		}
		delete(r.routes, p)
	}
	for _, rule := range r.rules {
		if err := r.h.RuleDel(rule); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("routing: remove rule %q: %w", ruleString(rule), err))
		}
	}
	r.rules = nil
	r.h.Close()
	return errors.Join(errs...)
}
