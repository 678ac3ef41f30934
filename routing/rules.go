package routing

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The rules (see the package doc): one per source prefix of the protect
// and drop policies, and per family a pair that takes marked packets past
// the narrower ones.

// source is one source prefix's rule: its references and what the kernel
// has.
type source struct {
	refs int // Tunnel references from this source
	// adopted: a rule a previous instance left, or a source the hold
	// file records. It is wanted while any adopted hold is unclaimed:
	// it may be what sends that hold's traffic to the table.
	adopted   bool
	installed bool // the rule is in the kernel
}

// guard is a family's mark rules: jump (Priority-1, marked packets go to
// Priority+1) and landing (the nop at Priority+1 it goes to).
type guard struct{ jump, landing bool }

// anySource is the prefix that covers every address of fam.
func anySource(fam int) netip.Prefix {
	if fam == unix.AF_INET6 {
		return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
}

// sourceRule is the rule of src: for a /0 source the family's
// "not fwmark Mark/Mask lookup Table" (what espd had before source rules,
// so that one an older espd left is this source's rule), else
// "from src lookup Table". It carries no protocol, so that deleting with
// it finds an older espd's untagged rule too; ruleAdd tags what it adds.
func sourceRule(cfg *Config, src netip.Prefix) *netlink.Rule {
	rule := netlink.NewRule()
	rule.Family = familyOf(src)
	rule.Table = cfg.Table
	rule.Priority = cfg.Priority
	rule.Type = unix.FR_ACT_TO_TBL
	if src.Bits() == 0 {
		rule.Mark = cfg.Mark
		mask := cfg.Mask
		rule.Mask = &mask
		rule.Invert = true
	} else {
		rule.Src = dst(src)
	}
	return rule
}

// jumpRule takes packets marked Mark past the source rules: the kernel's
// "not" inverts a rule's whole selector, so a source rule cannot leave
// them out itself.
func jumpRule(cfg *Config, fam int) *netlink.Rule {
	rule := netlink.NewRule()
	rule.Family = fam
	rule.Priority = cfg.Priority - 1
	rule.Goto = cfg.Priority + 1
	rule.Mark = cfg.Mark
	mask := cfg.Mask
	rule.Mask = &mask
	rule.Protocol = Protocol
	return rule
}

// landingRule is the jump's target: a goto needs a rule of that
// preference to land on.
func landingRule(cfg *Config, fam int) *netlink.Rule {
	rule := netlink.NewRule()
	rule.Family = fam
	rule.Priority = cfg.Priority + 1
	rule.Type = unix.FR_ACT_NOP
	rule.Protocol = Protocol
	return rule
}

// plainRule reports whether a listed rule selects on nothing but source
// and mark.
func plainRule(rl *netlink.Rule) bool {
	return rl.Dst == nil && rl.IifName == "" && rl.OifName == "" && rl.IPProto == 0 && rl.Sport == nil &&
		rl.Dport == nil && rl.UIDRange == nil && rl.TunID == 0 && rl.Tos == 0 && rl.Flow <= 0
}

// isSourceRule reports whether a listed rule of fam is a source rule of
// cfg's (whatever its protocol), and whose.
func isSourceRule(cfg *Config, fam int, rl *netlink.Rule) (netip.Prefix, bool) {
	if rl.Table != cfg.Table || rl.Priority != cfg.Priority || rl.Goto >= 0 || !plainRule(rl) {
		return netip.Prefix{}, false
	}
	if rl.Invert {
		if rl.Src == nil && rl.Mark == cfg.Mark && rl.Mask != nil && *rl.Mask == cfg.Mask {
			return anySource(fam), true
		}
		return netip.Prefix{}, false
	}
	if rl.Src == nil || rl.Mark != 0 || (rl.Mask != nil && *rl.Mask != 0) {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(rl.Src.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	if fam == unix.AF_INET {
		a = a.Unmap()
	}
	ones, _ := rl.Src.Mask.Size()
	p, err := a.Prefix(ones)
	if err != nil || p.Bits() == 0 || familyOf(p) != fam {
		return netip.Prefix{}, false
	}
	return p, true
}

func isJumpRule(cfg *Config, rl *netlink.Rule) bool {
	return rl.Protocol == Protocol && rl.Table == 0 && rl.Priority == cfg.Priority-1 && rl.Goto == cfg.Priority+1 &&
		!rl.Invert && rl.Src == nil && rl.Mark == cfg.Mark && rl.Mask != nil && *rl.Mask == cfg.Mask && plainRule(rl)
}

func isLandingRule(cfg *Config, rl *netlink.Rule) bool {
	return rl.Protocol == Protocol && rl.Table == 0 && rl.Priority == cfg.Priority+1 && rl.Goto < 0 &&
		!rl.Invert && rl.Src == nil && rl.Mark == 0 && rl.Mask == nil && plainRule(rl)
}

// ruleAdd adds a rule, tagged with Protocol, and notes it in r.added.
func (r *Router) ruleAdd(rule *netlink.Rule) error {
	tagged := *rule
	tagged.Protocol = Protocol
	if err := r.h.RuleAdd(&tagged); err != nil {
		return fmt.Errorf("routing: add rule %q: %w", ruleString(rule), err)
	}
	if r.added != nil {
		*r.added = append(*r.added, "rule "+ruleString(rule))
	}
	return nil
}

// ruleDel removes a rule; one that is gone already is no error.
func (r *Router) ruleDel(rule *netlink.Rule) error {
	if err := r.h.RuleDel(rule); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("routing: remove rule %q: %w", ruleString(rule), err)
	}
	return nil
}

// adoptRules takes over the rules a previous instance (or RestoreHolds)
// left: each source rule becomes an adopted source, the mark rules the
// family's guard. Duplicates are removed, one of each always stays.
func (r *Router) adoptRules() error {
	for _, fam := range r.cfg.families() {
		rules, err := r.h.RuleList(fam)
		if err != nil {
			return fmt.Errorf("routing: list rules: %w", err)
		}
		count := make(map[netip.Prefix]int)
		var order []netip.Prefix
		jumps, landings := 0, 0
		for i := range rules {
			rl := &rules[i]
			if p, ok := isSourceRule(&r.cfg, fam, rl); ok {
				if count[p] == 0 {
					order = append(order, p)
				}
				count[p]++
			} else if isJumpRule(&r.cfg, rl) {
				jumps++
			} else if isLandingRule(&r.cfg, rl) {
				landings++
			}
		}
		for _, p := range order {
			// Each RuleDel removes one of the identical rules.
			for n := count[p]; n > 1; n-- {
				if err := r.ruleDel(sourceRule(&r.cfg, p)); err != nil {
					return fmt.Errorf("%w (a duplicate)", err)
				}
			}
			s := r.source(p)
			s.adopted = true
			r.setInstalled(p, s, true)
		}
		g := r.guards[fam]
		for ; jumps > 1; jumps-- {
			if err := r.ruleDel(jumpRule(&r.cfg, fam)); err != nil {
				return err
			}
		}
		for ; landings > 1; landings-- {
			if err := r.ruleDel(landingRule(&r.cfg, fam)); err != nil {
				return err
			}
		}
		g.jump, g.landing = jumps > 0, landings > 0
		r.guards[fam] = g
	}
	return nil
}

// source returns src's entry, making it if need be. r.mu is held.
func (r *Router) source(src netip.Prefix) *source {
	s := r.sources[src]
	if s == nil {
		s = &source{}
		r.sources[src] = s
	}
	return s
}

func (r *Router) setInstalled(src netip.Prefix, s *source, on bool) {
	if s.installed == on {
		return
	}
	s.installed = on
	if src.Bits() > 0 {
		if on {
			r.narrow[familyOf(src)]++
		} else {
			r.narrow[familyOf(src)]--
		}
	}
}

// wantRule reports whether src's rule must be in the kernel.
func (r *Router) wantRule(s *source) bool {
	return s.refs > 0 || (s.adopted && r.unclaimed > 0)
}

// syncSource makes the kernel's rules for src match its references: a
// narrow source's rule goes in after its family's mark rules (espd's own
// packets never meet it) and comes out before them.
func (r *Router) syncSource(src netip.Prefix, s *source) error {
	fam := familyOf(src)
	want := r.wantRule(s)
	if want && !s.installed {
		if src.Bits() > 0 {
			if err := r.ensureGuard(fam); err != nil {
				return err
			}
		}
		if err := r.ruleAdd(sourceRule(&r.cfg, src)); err != nil {
			return err
		}
		r.setInstalled(src, s, true)
	}
	if !want && s.installed {
		if err := r.ruleDel(sourceRule(&r.cfg, src)); err != nil {
			r.untidy = true
			return err
		}
		r.setInstalled(src, s, false)
	}
	if !want && !s.installed && s.refs == 0 {
		delete(r.sources, src)
	}
	if r.narrow[fam] == 0 {
		if err := r.dropGuard(fam); err != nil {
			r.untidy = true
			return err
		}
	}
	return nil
}

// ensureGuard puts fam's mark rules in: the landing first, so that the
// jump never points nowhere.
func (r *Router) ensureGuard(fam int) error {
	g := r.guards[fam]
	defer func() { r.guards[fam] = g }()
	if !g.landing {
		if err := r.ruleAdd(landingRule(&r.cfg, fam)); err != nil {
			return err
		}
		g.landing = true
	}
	if !g.jump {
		if err := r.ruleAdd(jumpRule(&r.cfg, fam)); err != nil {
			return err
		}
		g.jump = true
	}
	return nil
}

// dropGuard removes fam's mark rules, the jump first.
func (r *Router) dropGuard(fam int) error {
	g := r.guards[fam]
	defer func() { r.guards[fam] = g }()
	if g.jump {
		if err := r.ruleDel(jumpRule(&r.cfg, fam)); err != nil {
			return err
		}
		g.jump = false
	}
	if g.landing {
		if err := r.ruleDel(landingRule(&r.cfg, fam)); err != nil {
			return err
		}
		g.landing = false
	}
	return nil
}

// tidyRules removes the rules no longer wanted: adopted sources once no
// adopted hold is left unclaimed, and any rule an earlier removal failed
// to take out. r.mu is held.
func (r *Router) tidyRules() error {
	if !r.untidy {
		return nil
	}
	r.untidy = false
	var errs []error
	for src, s := range r.sources {
		if r.unclaimed == 0 {
			s.adopted = false
		}
		errs = append(errs, r.syncSource(src, s))
	}
	for _, fam := range r.cfg.families() {
		if r.narrow[fam] == 0 {
			errs = append(errs, r.dropGuard(fam))
		}
	}
	if err := errors.Join(errs...); err != nil {
		r.untidy = true
		return err
	}
	return nil
}

// wantedSources lists the sources whose rules must be in the kernel,
// sorted. r.mu is held.
func (r *Router) wantedSources() []netip.Prefix {
	var out []netip.Prefix
	for p, s := range r.sources {
		if r.wantRule(s) {
			out = append(out, p)
		}
	}
	sortPrefixes(out)
	return out
}

// removeRules removes every rule r has in the kernel, the source rules
// before the mark rules. r.mu is held.
func (r *Router) removeRules() []error {
	var errs []error
	for src, s := range r.sources {
		if s.installed {
			if err := r.ruleDel(sourceRule(&r.cfg, src)); err != nil {
				errs = append(errs, err)
				continue
			}
			r.setInstalled(src, s, false)
		}
	}
	for _, fam := range r.cfg.families() {
		if err := r.dropGuard(fam); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func ruleString(r *netlink.Rule) string {
	fam := "inet"
	if r.Family == unix.AF_INET6 {
		fam = "inet6"
	}
	s := fmt.Sprintf("%s pref %d", fam, r.Priority)
	if r.Invert {
		s += " not"
	}
	if r.Src != nil {
		s += " from " + r.Src.String()
	}
	if r.Mark != 0 || r.Mask != nil {
		mask := uint32(0xffffffff)
		if r.Mask != nil {
			mask = *r.Mask
		}
		s += fmt.Sprintf(" fwmark %#x/%#x", r.Mark, mask)
	}
	switch {
	case r.Goto >= 0:
		s += fmt.Sprintf(" goto %d", r.Goto)
	case r.Table > 0:
		s += fmt.Sprintf(" lookup %d", r.Table)
	case r.Type == unix.FR_ACT_NOP || r.Protocol == Protocol:
		s += " nop"
	}
	return s
}

// ruleSourceFor returns the source whose rule a Tunnel reference from src
// takes: src itself, or its family's /0 source when one of the host's own
// addresses inside src sits on an interface that reaches beyond src.
//
// A packet the host sends from a socket neither bound nor connected is
// routed before it has a source, so a rule "from src" never sees it; the
// kernel then gives it the address of the interface the main table sends
// it out of. If that address lies inside src, the packet is a policy's
// traffic that would leave in clear. From an interface whose routes all
// stay inside src (the LAN a full tunnel protects as a whole) it only goes
// there, where XFRM's bypass-lan would send it too; from any other (the
// WAN address of a host-to-host policy, a PPP link's own address) it
// would cross the untrusted side, so such a source takes the /0 rule,
// which sends every unmarked packet of its family to the table (the table
// still routes only the policies' destinations into the TUN). What
// cannot be read counts as reaching beyond. It is decided at a source and
// destination's first reference, with the addresses and routes of that
// moment.
func (r *Router) ruleSourceFor(src netip.Prefix) netip.Prefix {
	fam := familyOf(src)
	if src.Bits() == 0 {
		return src
	}
	addrs, err := r.h.AddrList(nil, fam)
	if err != nil {
		return anySource(fam)
	}
	var links []int
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if !src.Contains(ip) || ip.IsLoopback() || ip.IsLinkLocalUnicast() {
			continue
		}
		ones, _ := a.Mask.Size()
		if sub := netip.PrefixFrom(ip, ones).Masked(); !within(sub, src) {
			return anySource(fam)
		}
		links = append(links, a.LinkIndex)
	}
	if len(links) == 0 {
		return src
	}
	routes, err := r.h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return anySource(fam)
	}
	for i := range routes {
		rt := &routes[i]
		if !routeUses(rt, links) {
			continue
		}
		p, ok := routePrefix(rt, fam)
		if !ok {
			return anySource(fam)
		}
		if p.Addr().IsLinkLocalUnicast() || p.Addr().IsMulticast() {
			continue // the kernel answers those from its link-local address
		}
		if !within(p, src) {
			return anySource(fam)
		}
	}
	return src
}

// within reports whether prefix a lies inside prefix b.
func within(a, b netip.Prefix) bool { return b.Bits() <= a.Bits() && b.Contains(a.Addr()) }

// routeUses reports whether a route leaves through one of the links.
func routeUses(rt *netlink.Route, links []int) bool {
	if slices.Contains(links, rt.LinkIndex) {
		return true
	}
	for _, nh := range rt.MultiPath {
		if slices.Contains(links, nh.LinkIndex) {
			return true
		}
	}
	return false
}
