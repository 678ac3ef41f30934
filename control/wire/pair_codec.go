package wire

import "fmt"

// Gateway-pair attributes (docs/control-protocol.md, section 10).
const (
	AttrPairNode      AttrType = 88 // u32: this node, 1 or 2
	AttrPairRole      AttrType = 89 // u32: PairRoleXxx
	AttrPairReleased  AttrType = 90 // u32: outbound states the last activation released
	AttrPairSilent    AttrType = 91 // u32: outbound states left silent (no fresh report)
	AttrPairPeerHeard AttrType = 92 // u64: ms since the other node was last heard, 0 never
)

// PairRole is a gateway-pair node's role (0 in a request: just report it).
type PairRole uint32

// Wire values of AttrPairRole.
const (
	PairRoleNone    PairRole = 0
	PairRoleActive  PairRole = 1
	PairRoleStandby PairRole = 2
)

// String returns "none", "active" or "standby".
func (r PairRole) String() string {
	switch r {
	case PairRoleNone:
		return "none"
	case PairRoleActive:
		return "active"
	case PairRoleStandby:
		return "standby"
	}
	return fmt.Sprintf("role(%d)", uint32(r))
}

// PairStatus is the PAIR_ROLE reply: a gateway-pair node's state.
type PairStatus struct {
	Node     uint32 // 1 or 2
	Role     PairRole
	Released uint32 // outbound states the last activation released
	Silent   uint32 // outbound states that stay silent (no fresh report: rekeyed)
	// PeerHeardMs is the time since the other node was last heard, in
	// ms; 0: never.
	PeerHeardMs uint64
}

// PutPairRole appends the attribute of a PAIR_ROLE request: the role to
// take, or nothing for PairRoleNone (a query).
func PutPairRole(b *Builder, role PairRole) {
	if role != PairRoleNone {
		b.U32(AttrPairRole, uint32(role))
	}
}

// ReadPairRole reads a PAIR_ROLE request: PairRoleNone without
// PAIR_ROLE, else PairRoleActive or PairRoleStandby (any other value:
// EINVAL).
func ReadPairRole(attrs []Attr) (PairRole, error) {
	r := newReader(attrs)
	v, ok := r.u32(AttrPairRole)
	if ok && v != uint32(PairRoleActive) && v != uint32(PairRoleStandby) {
		r.fail(EINVAL, AttrPairRole, "%s must be 1 (active) or 2 (standby), not %d", attrName(spaceTop, AttrPairRole), v)
	}
	if r.err != nil {
		return PairRoleNone, r.error()
	}
	return PairRole(v), nil
}

// PutPairStatus appends the attributes of a PAIR_ROLE reply.
func PutPairStatus(b *Builder, st PairStatus) {
	b.U32(AttrPairNode, st.Node)
	b.U32(AttrPairRole, uint32(st.Role))
	b.U32(AttrPairReleased, st.Released)
	b.U32(AttrPairSilent, st.Silent)
	b.U64(AttrPairPeerHeard, st.PeerHeardMs)
}

// ReadPairStatus reads a PAIR_ROLE reply: PAIR_NODE (1 or 2) and
// PAIR_ROLE (0-2) are required, the counters read as 0 when absent.
func ReadPairStatus(attrs []Attr) (PairStatus, error) {
	r := newReader(attrs)
	var st PairStatus
	node, ok := r.u32(AttrPairNode)
	r.require(AttrPairNode, ok)
	if ok && node != 1 && node != 2 {
		r.fail(EINVAL, AttrPairNode, "%s must be 1 or 2, not %d", attrName(spaceTop, AttrPairNode), node)
	}
	role, ok := r.u32max(AttrPairRole, uint32(PairRoleStandby))
	r.require(AttrPairRole, ok)
	st.Node, st.Role = node, PairRole(role)
	st.Released, _ = r.u32(AttrPairReleased)
	st.Silent, _ = r.u32(AttrPairSilent)
	st.PeerHeardMs, _ = r.u64(AttrPairPeerHeard)
	if err := r.error(); err != nil {
		return PairStatus{}, err
	}
	return st, nil
}
