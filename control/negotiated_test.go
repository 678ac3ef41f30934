package control

import (
	"errors"
	"strings"
	"testing"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// TestNegotiatedServer adds states over the socket: without NEGOTIATED a
// state is manual, with it negotiated; a bad value or size is an error
// reply naming the attribute, and SA_UPDATE cannot change it.
func TestNegotiatedServer(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := dial(t, ts.path)
	ctx := testCtx(t)

	manual := gcmConfig(t, 0x1001)
	manual.Dir = sa.DirOut
	if err := c.AddSA(ctx, manual); err != nil {
		t.Fatal(err)
	}
	neg := gcmConfig(t, 0x1002)
	neg.Dir = sa.DirOut
	neg.EncKey[0] ^= 0xff // a key of its own
	neg.Negotiated = true
	if err := c.AddSA(ctx, neg); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg  sa.Config
		want bool
	}{{manual, false}, {neg, true}} {
		s, ok := ts.db.GetSA(tc.cfg.SPI, tc.cfg.Dst)
		if !ok || s.Config().Negotiated != tc.want {
			t.Errorf("state 0x%x: installed %v, negotiated %v, want %v", tc.cfg.SPI, ok, s != nil && s.Config().Negotiated, tc.want)
		}
		info, err := c.GetSA(ctx, tc.cfg.SPI, tc.cfg.Dst)
		if err != nil || info.Config.Negotiated != tc.want {
			t.Errorf("SA_GET 0x%x: negotiated %v, %v; want %v", tc.cfg.SPI, info.Config.Negotiated, err, tc.want)
		}
	}
	list, err := c.ListSAs(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("SA_GET dump: %d states, %v", len(list), err)
	}
	for _, in := range list {
		if in.Config.Negotiated != (in.Config.SPI == neg.SPI) {
			t.Errorf("SA_GET dump: state 0x%x negotiated %v", in.Config.SPI, in.Config.Negotiated)
		}
	}

	bad := gcmConfig(t, 0x1003)
	bad.EncKey[1] ^= 0xff
	for _, tc := range []struct {
		name string
		put  func(*wire.Builder)
		code wire.Errno
	}{
		{"value 2", func(b *wire.Builder) { b.U32(wire.AttrNegotiated, 2) }, wire.EINVAL},
		{"2 bytes", func(b *wire.Builder) { b.Raw(wire.AttrNegotiated, []byte{0, 1}) }, wire.EBADMSG},
		{"8 bytes", func(b *wire.Builder) { b.U64(wire.AttrNegotiated, 1) }, wire.EBADMSG},
	} {
		_, err := c.do(ctx, wire.MsgSAAdd, func(b *wire.Builder) { wire.PutSAAdd(b, bad); tc.put(b) })
		var e *wire.Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Attr != wire.AttrNegotiated || !strings.Contains(e.Msg, "NEGOTIATED") {
			t.Errorf("%s: %v, want %v naming NEGOTIATED", tc.name, err, tc.code)
		}
		if _, ok := ts.db.GetSA(bad.SPI, bad.Dst); ok {
			t.Errorf("%s: state installed", tc.name)
		}
	}

	// SA_UPDATE: the same value is fine, another is refused.
	up := wire.SAUpdate{SPI: neg.SPI, Dst: neg.Dst, Config: sa.Config{Negotiated: true, TTL: 7}, Fields: wire.FieldNegotiated | wire.FieldTTL}
	if err := c.UpdateSA(ctx, up); err != nil {
		t.Errorf("SA_UPDATE keeping NEGOTIATED: %v", err)
	}
	up.Config.Negotiated = false
	err = c.UpdateSA(ctx, up)
	var e *wire.Error
	if !errors.As(err, &e) || e.Code != wire.EINVAL || e.Attr != wire.AttrNegotiated || !strings.Contains(e.Msg, "cannot change whether its keys were negotiated") {
		t.Errorf("SA_UPDATE turning a negotiated state manual: %v", err)
	}
	up = wire.SAUpdate{SPI: manual.SPI, Dst: manual.Dst, Config: sa.Config{Negotiated: true}, Fields: wire.FieldNegotiated}
	if err := c.UpdateSA(ctx, up); err == nil {
		t.Error("SA_UPDATE turning a manual state negotiated succeeded")
	}
	if s, _ := ts.db.GetSA(manual.SPI, manual.Dst); s.Config().Negotiated {
		t.Error("refused SA_UPDATE made the manual state negotiated")
	}
}
