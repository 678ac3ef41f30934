package control

import (
	"strings"
	"testing"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/control/wire/wiretest"
	"github.com/espd/espd/sa"
)

// TestClientTransportMode: a transport-mode state and policy go through
// the server into sa.DB and come back in SA_GET, SA_LIST, POLICY_ADD's
// reply, POLICY_GET and POLICY_LIST; states and policies given no mode are
// tunnel mode.
func TestClientTransportMode(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := dial(t, ts.path)
	ctx := testCtx(t)

	tr := wiretest.TransportConfig(t, 0x4001)
	if err := c.AddSA(ctx, tr); err != nil {
		t.Fatal(err)
	}
	tun := gcmConfig(t, 0x4002)
	req := wire.FieldSrc | wire.FieldDst | wire.FieldDir | wire.FieldSuite | wire.FieldKeys
	if err := c.AddSAFields(ctx, tun, req); err != nil {
		t.Fatal(err)
	}
	if s, ok := ts.db.GetSA(tr.SPI, tr.Dst); !ok || s.Mode() != sa.ModeTransport {
		t.Fatalf("transport state in the SAD: %v", s)
	}
	if s, ok := ts.db.GetSA(tun.SPI, tun.Dst); !ok || s.Mode() != sa.ModeTunnel {
		t.Fatalf("state without MODE in the SAD: %v", s)
	}
	in, err := c.GetSA(ctx, tr.SPI, tr.Dst)
	if err != nil || in.Config.Mode != sa.ModeTransport {
		t.Fatalf("GetSA: mode %v (%v), want transport", in.Config.Mode, err)
	}
	list, err := c.ListSAs(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("ListSAs: %v %v", list, err)
	}
	for _, in := range list {
		want := sa.ModeTunnel
		if in.Config.SPI == tr.SPI {
			want = sa.ModeTransport
		}
		if in.Config.Mode != want {
			t.Errorf("ListSAs: spi 0x%x mode %v, want %v", in.Config.SPI, in.Config.Mode, want)
		}
	}

	p := wiretest.TransportPolicy()
	got, err := c.AddPolicy(ctx, p)
	if err != nil || got.Mode != sa.ModeTransport {
		t.Fatalf("AddPolicy: %v (%v)", got, err)
	}
	if g, ok := ts.db.GetPolicy(p.ID()); !ok || g.Mode != sa.ModeTransport {
		t.Fatalf("transport policy in the SPD: %v", g)
	}
	if g, err := c.GetPolicy(ctx, p.ID()); err != nil || g.Mode != sa.ModeTransport {
		t.Fatalf("GetPolicy: %v (%v)", g, err)
	}
	def := fullPolicy()
	def.Index = 0
	if g, err := c.AddPolicy(ctx, def); err != nil || g.Mode != sa.ModeTunnel {
		t.Fatalf("AddPolicy without mode: %v (%v)", g, err)
	}
	pols, err := c.ListPolicies(ctx)
	if err != nil || len(pols) != 2 {
		t.Fatalf("ListPolicies: %v %v", pols, err)
	}
	for _, g := range pols {
		if want := map[bool]sa.Mode{true: sa.ModeTransport, false: sa.ModeTunnel}[g.ID() == p.ID()]; g.Mode != want {
			t.Errorf("ListPolicies: %v mode %v, want %v", g.ID(), g.Mode, want)
		}
	}
	// POLICY_UPDATE may change a template's mode: it is no part of the
	// policy's name.
	p.Mode = sa.ModeTunnel
	if g, err := c.UpdatePolicy(ctx, p); err != nil || g.Mode != sa.ModeTunnel {
		t.Fatalf("UpdatePolicy to tunnel: %v (%v)", g, err)
	}
}

// TestTransportModeRefusals: the server answers a MODE it does not know,
// a change of a state's mode and TFC padding on a transport-mode state
// with EINVAL and a message that says why (ERR_ATTR MODE where the mode
// is at fault), leaves the states as they were, and keeps serving the
// connection.
func TestTransportModeRefusals(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := dial(t, ts.path)
	rc := rawDial(t, ts.path)
	ctx := testCtx(t)
	tr := wiretest.TransportConfig(t, 0x4101)
	tun := gcmConfig(t, 0x4102)
	for _, cfg := range []sa.Config{tr, tun} {
		if err := c.AddSA(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	padded := wiretest.TransportConfig(t, 0x4103)
	padded.EncKey = key(len(padded.EncKey), 77)
	padded.TFCPadTo = 1200

	seq := uint32(10)
	for _, tc := range []struct {
		name string
		typ  wire.MsgType
		fill func(*wire.Builder)
		attr wire.AttrType // ERR_ATTR, 0 for none
		msg  string
	}{
		{"SA_ADD MODE 3", wire.MsgSAAdd, func(b *wire.Builder) {
			cfg := gcmConfig(t, 0x4104)
			cfg.EncKey = key(len(cfg.EncKey), 90)
			wire.PutSAAddFields(b, cfg, wire.FieldSrc|wire.FieldDst|wire.FieldDir|wire.FieldSuite|wire.FieldKeys)
			b.U32(wire.AttrMode, 3)
		}, wire.AttrMode, "MODE (6) of a state must be 1 (transport) or 2 (tunnel), not 3"},
		{"POLICY_ADD MODE 0", wire.MsgPolicyAdd, func(b *wire.Builder) {
			wire.PutPolicy(b, fullPolicy())
			b.U32(wire.AttrMode, 0)
		}, wire.AttrMode, "MODE (6) of a policy must be 1 (transport) or 2 (tunnel), not 0"},
		{"SA_UPDATE transport to tunnel", wire.MsgSAUpdate, func(b *wire.Builder) {
			wire.PutSAID(b, tr.SPI, tr.Dst)
			b.U32(wire.AttrMode, wire.ModeTunnel)
		}, wire.AttrMode, "cannot change the mode"},
		{"SA_UPDATE tunnel to transport", wire.MsgSAUpdate, func(b *wire.Builder) {
			wire.PutSAID(b, tun.SPI, tun.Dst)
			b.U32(wire.AttrMode, wire.ModeTransport)
		}, wire.AttrMode, "cannot change the mode"},
		{"SA_ADD transport with TFC_PAD", wire.MsgSAAdd, func(b *wire.Builder) { wire.PutSAAdd(b, padded) },
			0, "transport mode takes no TFC padding"},
		{"SA_UPDATE TFC_PAD of a transport state", wire.MsgSAUpdate, func(b *wire.Builder) {
			wire.PutSAID(b, tr.SPI, tr.Dst)
			b.U32(wire.AttrTFCPad, 1000)
		}, 0, "transport mode takes no TFC padding"},
	} {
		seq++
		rc.send(encode(t, tc.typ, 0, seq, tc.fill))
		e := rc.wantError(seq, wire.EINVAL)
		if (tc.attr != 0 && e.Attr != tc.attr) || !strings.Contains(e.Msg, tc.msg) {
			t.Errorf("%s: ERROR %q attribute %d, want %q naming %s", tc.name, e.Msg, e.Attr, tc.msg, wire.AttrName(0, tc.attr))
		}
		seq++
		rc.wantUsable(seq)
	}
	if _, ok := ts.db.GetSA(padded.SPI, padded.Dst); ok {
		t.Error("the transport-mode state with TFC padding was installed")
	}
	if n := len(ts.db.Policies()); n != 0 {
		t.Errorf("%d policies installed", n)
	}
	for _, cfg := range []sa.Config{tr, tun} {
		in, err := c.GetSA(ctx, cfg.SPI, cfg.Dst)
		if err != nil || in.Config.Mode != cfg.Mode || in.Config.TFCPadTo != 0 {
			t.Errorf("spi 0x%x after the refusals: %v (%v), want mode %v, no TFC", cfg.SPI, in.Config, err, cfg.Mode)
		}
	}
	// The state's own mode is accepted.
	seq++
	rc.send(encode(t, wire.MsgSAUpdate, 0, seq, func(b *wire.Builder) {
		wire.PutSAID(b, tr.SPI, tr.Dst)
		b.U32(wire.AttrMode, wire.ModeTransport)
	}))
	if m, err := rc.read(); err != nil || m.Type != wire.MsgSAUpdate || m.Seq != seq {
		t.Fatalf("SA_UPDATE with the state's own MODE: %v %v", m, err)
	}
}
