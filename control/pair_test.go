package control

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// pairBackend is a Backend in a gateway pair: node 1, no role until told.
type pairBackend struct {
	dbBackend
	mu    sync.Mutex
	st    wire.PairStatus
	err   error           // returned by PairRole when set
	calls []wire.PairRole // the roles PairRole was called with
}

func (b *pairBackend) PairRole(role wire.PairRole) (wire.PairStatus, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, role)
	if b.err != nil {
		return wire.PairStatus{}, b.err
	}
	if role != wire.PairRoleNone && role != b.st.Role {
		b.st.Role = role
		b.st.Released, b.st.Silent = 0, 0
		if role == wire.PairRoleActive {
			b.st.Released, b.st.Silent = 3, 1
		}
	}
	return b.st, nil
}

func (b *pairBackend) setErr(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.err = err
}

func (b *pairBackend) called() []wire.PairRole {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]wire.PairRole(nil), b.calls...)
}

func startPairServer(t *testing.T) (*pairBackend, string) {
	t.Helper()
	b := &pairBackend{dbBackend: dbBackend{sa.NewDB(sa.Options{})}, st: wire.PairStatus{Node: 1, PeerHeardMs: 120}}
	path := filepath.Join(t.TempDir(), "espd.sock")
	serveT(t, b, ServerConfig{Path: path, Logf: t.Logf})
	return b, path
}

// TestClientPairRole sets and reads the role through the client.
func TestClientPairRole(t *testing.T) {
	b, path := startPairServer(t)
	c := dial(t, path)
	ctx := testCtx(t)
	steps := []struct {
		role wire.PairRole
		want wire.PairStatus
	}{
		{wire.PairRoleNone, wire.PairStatus{Node: 1, PeerHeardMs: 120}},
		{wire.PairRoleActive, wire.PairStatus{Node: 1, Role: wire.PairRoleActive, Released: 3, Silent: 1, PeerHeardMs: 120}},
		{wire.PairRoleNone, wire.PairStatus{Node: 1, Role: wire.PairRoleActive, Released: 3, Silent: 1, PeerHeardMs: 120}},
		{wire.PairRoleStandby, wire.PairStatus{Node: 1, Role: wire.PairRoleStandby, PeerHeardMs: 120}},
	}
	for i, s := range steps {
		got, err := c.PairRole(ctx, s.role)
		if err != nil || got != s.want {
			t.Fatalf("step %d, PairRole(%v): %+v, %v; want %+v", i, s.role, got, err, s.want)
		}
	}
	if calls := fmt.Sprint(b.called()); calls != "[none active none standby]" {
		t.Fatalf("backend called with %s", calls)
	}

	// A role out of range is the server's to refuse: the backend never
	// sees it.
	_, err := c.PairRole(ctx, 3)
	wantCode(t, err, wire.EINVAL)
	if n := len(b.called()); n != len(steps) {
		t.Fatalf("backend called %d times, want %d", n, len(steps))
	}

	// The backend's error comes back with its code.
	b.setErr(wire.Errorf(wire.EAGAIN, "the other node is still active"))
	_, err = c.PairRole(ctx, wire.PairRoleActive)
	wantCode(t, err, wire.EAGAIN)
	if !strings.Contains(err.Error(), "the other node is still active") {
		t.Fatalf("error %v", err)
	}
	b.setErr(fmt.Errorf("pair channel: %w", syscall.ECONNREFUSED))
	_, err = c.PairRole(ctx, wire.PairRoleNone)
	wantCode(t, err, wire.Errno(syscall.ECONNREFUSED))

	// An espd that is not one of a pair.
	ts := startServer(t, ServerConfig{})
	_, err = dial(t, ts.path).PairRole(ctx, wire.PairRoleNone)
	wantCode(t, err, wire.EOPNOTSUPP)
}

// TestPairRoleMalformed sends broken PAIR_ROLE requests: each gets an
// ERROR naming the attribute, the backend is not called and the
// connection stays usable.
func TestPairRoleMalformed(t *testing.T) {
	b, path := startPairServer(t)
	rc := rawDial(t, path)
	cases := []struct {
		name string
		fill func(*wire.Builder)
		code wire.Errno
		want string
	}{
		{"role 0", func(b *wire.Builder) { b.U32(wire.AttrPairRole, 0) }, wire.EINVAL, "PAIR_ROLE (89) must be 1 (active) or 2 (standby), not 0"},
		{"role 3", func(b *wire.Builder) { b.U32(wire.AttrPairRole, 3) }, wire.EINVAL, "not 3"},
		{"short role", func(b *wire.Builder) { b.Raw(wire.AttrPairRole, []byte{1}) }, wire.EBADMSG, "value of 1 bytes, want 4"},
		{"role twice", func(b *wire.Builder) { b.U32(wire.AttrPairRole, 1); b.U32(wire.AttrPairRole, 1) }, wire.EBADMSG, "duplicate PAIR_ROLE"},
	}
	for i, c := range cases {
		seq := uint32(10 + i)
		rc.send(encode(t, wire.MsgPairRole, 0, seq, c.fill))
		e := rc.wantError(seq, c.code)
		if e.Type != wire.MsgPairRole || e.Attr != wire.AttrPairRole || !strings.Contains(e.Msg, c.want) {
			t.Errorf("%s: ERROR type %v attribute %d %q, want PAIR_ROLE, attribute %d, %q", c.name, e.Type, e.Attr, e.Msg, wire.AttrPairRole, c.want)
		}
	}
	rc.wantUsable(30)
	if calls := b.called(); len(calls) != 0 {
		t.Fatalf("backend called with %v", calls)
	}

	// A well-formed request gets a single reply of its type; an unknown
	// attribute is skipped.
	rc.send(encode(t, wire.MsgPairRole, 0, 31, func(b *wire.Builder) { wire.PutPairRole(b, wire.PairRoleStandby); b.Raw(200, []byte("x")) }))
	m, err := rc.read()
	if err != nil || m.Type != wire.MsgPairRole || m.Flags != wire.FlagReply || m.Seq != 31 {
		t.Fatalf("reply %+v, %v", m, err)
	}
	st, err := wire.ReadPairStatus(m.Attrs)
	if err != nil || st != (wire.PairStatus{Node: 1, Role: wire.PairRoleStandby, PeerHeardMs: 120}) {
		t.Fatalf("status %+v, %v", st, err)
	}
}
