package sa

import (
	"fmt"
	"net/netip"
	"strings"
)

// Policy is one entry of the security policy database.
type Policy struct {
	Selector
	// Dir is DirOut for traffic leaving through espd, DirIn for traffic
	// delivered to this host, DirFwd for traffic forwarded through it.
	Dir    Direction
	Action Action
	// Priority orders overlapping policies: lower wins. Between policies
	// of equal priority the more specific selector wins (longer prefixes,
	// then a protocol, then narrower port ranges), then the older policy.
	Priority uint32
	// ReqID ties a protect policy to its states (Config.ReqID).
	ReqID uint32
	// Index is assigned by AddPolicy (the value passed in is ignored); as
	// in XFRM, Index%8 is the direction.
	Index uint32
	// TmplSrc and TmplDst are the tunnel endpoints of the template: the
	// outer addresses of the states an acquire asks for.
	TmplSrc, TmplDst netip.Addr
	// Mode is the template's mode: a protect policy is served only by
	// states of its mode (Config.Mode), and an outbound transport-mode
	// policy's route lets the host hand espd whole datagrams (package
	// routing, Transport).
	Mode Mode
	// IfID is XFRM's if_id: a policy with IfID N applies only to packets
	// routed into the route-based interface N (docs/architecture.md,
	// "Route-based interfaces"); 0 is espd's policy-based TUN. It is part
	// of the policy's identity: one selector may exist once per IfID.
	IfID uint32
}

// ID returns what identifies p among the installed policies.
func (p Policy) ID() PolicyID { return PolicyID{Selector: p.Selector, Dir: p.Dir, IfID: p.IfID} }

// Validate reports what makes p unusable (classed ErrInvalid).
func (p Policy) Validate() error { return classed(ErrInvalid, p.check()) }

// check is Validate's checks, unclassed.
func (p Policy) check() error {
	if p.Dir >= numDirections {
		return fmt.Errorf("sa: policy direction %v is not in, out or fwd", p.Dir)
	}
	if p.Action >= numActions {
		return fmt.Errorf("sa: policy action %v is not protect, bypass or drop", p.Action)
	}
	if err := p.Selector.Validate(); err != nil {
		return err
	}
	if p.Mode >= numModes {
		return fmt.Errorf("sa: policy mode %v is not tunnel or transport", p.Mode)
	}
	if p.TmplSrc.IsValid() && p.TmplDst.IsValid() && p.TmplSrc.Is4() != p.TmplDst.Is4() {
		return fmt.Errorf("sa: policy template mixes address families (%v, %v)", p.TmplSrc, p.TmplDst)
	}
	return nil
}

// String returns the policy in the style of ip-xfrm(8).
func (p Policy) String() string {
	var b strings.Builder
	b.WriteString(p.Selector.String())
	fmt.Fprintf(&b, " dir %v action %v priority %d index %d", p.Dir, p.Action, p.Priority, p.Index)
	if p.ReqID != 0 {
		fmt.Fprintf(&b, " reqid %d", p.ReqID)
	}
	if p.TmplSrc.IsValid() || p.TmplDst.IsValid() {
		fmt.Fprintf(&b, " tmpl src %v dst %v", p.TmplSrc, p.TmplDst)
	}
	if p.Mode != ModeTunnel {
		fmt.Fprintf(&b, " mode %v", p.Mode)
	}
	if p.IfID != 0 {
		fmt.Fprintf(&b, " if_id %d", p.IfID)
	}
	return b.String()
}

// rank orders policies for lookup: the lowest rank among the matching
// policies wins. hi holds the priority above the inverted specificity, lo
// the age, so that no two policies have the same rank.
type rank struct{ hi, lo uint64 }

func (r rank) less(o rank) bool { return r.hi < o.hi || r.hi == o.hi && r.lo < o.lo }

// maxSpecificity bounds specificity: 9 bits of prefix lengths, 1 bit of
// protocol, 17 bits of port narrowness.
const maxSpecificity = 1<<27 - 1

// specificity grows with how little traffic s describes: the sum of its
// prefix lengths first, then whether it names a protocol, then how narrow
// its port ranges are.
func specificity(s Selector) uint64 {
	_, sb := prefixFam(s.Src)
	_, db := prefixFam(s.Dst)
	spec := uint64(sb+db) << 18
	if s.Proto != 0 {
		spec |= 1 << 17
	}
	return spec | uint64(1<<16-s.SrcPorts.width()) + uint64(1<<16-s.DstPorts.width())
}

func rankOf(p *Policy, age uint64) rank {
	return rank{hi: uint64(p.Priority)<<32 | (maxSpecificity - specificity(p.Selector)), lo: age}
}

// policyEntry is an installed policy; immutable once published.
type policyEntry struct {
	Policy
	rank rank
}

// matchesRest reports whether f has the protocol and ports of the entry;
// the addresses were matched by the tuple's hash.
func (e *policyEntry) matchesRest(f *flowBits) bool {
	return (e.Proto == 0 || e.Proto == f.proto) &&
		e.SrcPorts.Contains(f.sport) && e.DstPorts.Contains(f.dport)
}

// policyID is what makes a policy unique: its selector, direction and
// interface ID.
type policyID struct {
	sel  Selector
	dir  Direction
	ifID uint32
}

func (id PolicyID) key() policyID {
	return policyID{sel: id.Selector.normalized(), dir: id.Dir, ifID: id.IfID}
}
