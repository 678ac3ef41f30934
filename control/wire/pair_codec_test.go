package wire

import (
	"errors"
	"strings"
	"testing"
)

func TestPairMessageType(t *testing.T) {
	if MsgPairRole.String() != "PAIR_ROLE" || MsgPairRole.Reserved() {
		t.Fatalf("%v: reserved %v", MsgPairRole, MsgPairRole.Reserved())
	}
	for r, want := range map[PairRole]string{PairRoleNone: "none", PairRoleActive: "active", PairRoleStandby: "standby", 7: "role(7)"} {
		if r.String() != want {
			t.Errorf("PairRole(%d) = %q, want %q", uint32(r), r.String(), want)
		}
	}
	if got := AttrName(0, AttrPairPeerHeard); got != "PAIR_PEER_HEARD (92)" {
		t.Errorf("AttrName: %q", got)
	}
}

func TestPairRoleRoundTrip(t *testing.T) {
	for _, role := range []PairRole{PairRoleNone, PairRoleActive, PairRoleStandby} {
		m := decodeOK(t, encode(t, MsgPairRole, 0, 1, func(b *Builder) { PutPairRole(b, role) }))
		if role == PairRoleNone && len(m.Attrs) != 0 {
			t.Errorf("a query carries %d attributes, want none", len(m.Attrs))
		}
		got, err := ReadPairRole(m.Attrs)
		if err != nil || got != role {
			t.Errorf("role %v: got %v, %v", role, got, err)
		}
	}
}

func TestPairStatusRoundTrip(t *testing.T) {
	for _, st := range []PairStatus{
		{Node: 1, Role: PairRoleActive, Released: 3, PeerHeardMs: 120},
		{Node: 2, Role: PairRoleStandby, Silent: 1<<32 - 1, Released: 1<<32 - 1, PeerHeardMs: 1<<64 - 1},
		{Node: 2},
	} {
		m := decodeOK(t, encode(t, MsgPairRole, FlagReply, 1, func(b *Builder) { PutPairStatus(b, st) }))
		got, err := ReadPairStatus(m.Attrs)
		if err != nil || got != st {
			t.Errorf("round trip: %v\n got %+v\nwant %+v", err, got, st)
		}
	}
	// The counters may be left out: they read as 0.
	m := decodeOK(t, encode(t, MsgPairRole, FlagReply, 1, func(b *Builder) { b.U32(AttrPairNode, 1); b.U32(AttrPairRole, 1) }))
	if got, err := ReadPairStatus(m.Attrs); err != nil || got != (PairStatus{Node: 1, Role: PairRoleActive}) {
		t.Errorf("without counters: %+v, %v", got, err)
	}
}

func TestPairRejects(t *testing.T) {
	role := func(fill func(*Builder)) func() error {
		return func() error {
			_, err := ReadPairRole(decodeOK(t, encode(t, MsgPairRole, 0, 1, fill)).Attrs)
			return err
		}
	}
	status := func(fill func(*Builder)) func() error {
		return func() error {
			_, err := ReadPairStatus(decodeOK(t, encode(t, MsgPairRole, FlagReply, 1, fill)).Attrs)
			return err
		}
	}
	good := PairStatus{Node: 1, Role: PairRoleActive}
	cases := []struct {
		name string
		run  func() error
		code Errno
		attr AttrType
		want string
	}{
		{"role 0", role(func(b *Builder) { b.U32(AttrPairRole, 0) }), EINVAL, AttrPairRole, "PAIR_ROLE (89) must be 1 (active) or 2 (standby), not 0"},
		{"role 3", role(func(b *Builder) { b.U32(AttrPairRole, 3) }), EINVAL, AttrPairRole, "not 3"},
		{"role max", role(func(b *Builder) { b.U32(AttrPairRole, 1<<32-1) }), EINVAL, AttrPairRole, "not 4294967295"},
		{"role short", role(func(b *Builder) { b.Raw(AttrPairRole, []byte{0, 1}) }), EBADMSG, AttrPairRole, "value of 2 bytes, want 4"},
		{"role u64", role(func(b *Builder) { b.U64(AttrPairRole, 1) }), EBADMSG, AttrPairRole, "want 4"},
		{"role twice", role(func(b *Builder) { b.U32(AttrPairRole, 1); b.U32(AttrPairRole, 2) }), EBADMSG, AttrPairRole, "duplicate PAIR_ROLE"},
		{"status without node", status(func(b *Builder) { b.U32(AttrPairRole, 1) }), EINVAL, AttrPairNode, "missing required PAIR_NODE"},
		{"status without role", status(func(b *Builder) { b.U32(AttrPairNode, 1) }), EINVAL, AttrPairRole, "missing required PAIR_ROLE"},
		{"status node 0", status(func(b *Builder) { b.U32(AttrPairNode, 0); b.U32(AttrPairRole, 1) }), EINVAL, AttrPairNode, "PAIR_NODE (88) must be 1 or 2, not 0"},
		{"status node 3", status(func(b *Builder) { b.U32(AttrPairNode, 3); b.U32(AttrPairRole, 1) }), EINVAL, AttrPairNode, "not 3"},
		{"status role 3", status(func(b *Builder) { b.U32(AttrPairNode, 1); b.U32(AttrPairRole, 3) }), EINVAL, AttrPairRole, "PAIR_ROLE (89): value 3 out of range 0-2"},
		{"status released u64", status(func(b *Builder) { PutPairStatus(b, good); b.U64(AttrPairReleased, 1) }), EBADMSG, AttrPairReleased, "duplicate PAIR_RELEASED"},
		{"status silent short", status(func(b *Builder) { b.U32(AttrPairNode, 1); b.U32(AttrPairRole, 1); b.Raw(AttrPairSilent, []byte{1}) }), EBADMSG, AttrPairSilent, "PAIR_SILENT (91): value of 1 bytes, want 4"},
		{"status peer heard u32", status(func(b *Builder) { b.U32(AttrPairNode, 1); b.U32(AttrPairRole, 1); b.U32(AttrPairPeerHeard, 1) }), EBADMSG, AttrPairPeerHeard, "PAIR_PEER_HEARD (92): value of 4 bytes, want 8"},
	}
	for _, c := range cases {
		err := c.run()
		var e *Error
		if !errors.As(err, &e) || e.Code != c.code || e.Attr != c.attr || !strings.Contains(e.Msg, c.want) {
			t.Errorf("%s: error %#v, want %v on %s containing %q", c.name, err, c.code, AttrName(0, c.attr), c.want)
		}
	}
}
