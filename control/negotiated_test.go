package control

import (
	"errors"
	"strings"
	"testing"

	"github.com/espd/espd/sa"
)

// TestNegotiatedRoundTrip: NEGOTIATED survives SA_ADD, SA_UPDATE and an
// SA_GET reply; a manual state does not carry it.
func TestNegotiatedRoundTrip(t *testing.T) {
	cfg := gcmConfig(t, 0x77)
	cfg.Negotiated = true
	m := decodeOK(t, encode(t, MsgSAAdd, 0, 1, func(b *Builder) { putSAConfig(b, cfg, true) }))
	got, err := readSAAdd(m.Attrs)
	if err != nil || !got.Negotiated || !sameConfig(got, cfg) {
		t.Fatalf("SA_ADD round trip: %v (negotiated %v), %v", got, got.Negotiated, err)
	}
	info, err := readSAInfo(decodeOK(t, encode(t, MsgSAGet, FlagReply, 1, func(b *Builder) { putSAInfo(b, SAInfo{Config: cfg}) })).Attrs)
	if err != nil || !info.Config.Negotiated {
		t.Fatalf("SA_GET reply: negotiated %v, %v", info.Config.Negotiated, err)
	}
	for _, v := range []bool{false, true} {
		c := cfg
		c.Negotiated = v
		m := decodeOK(t, encode(t, MsgSAUpdate, 0, 1, func(b *Builder) {
			b.U32(AttrSPI, c.SPI)
			b.Addr(AttrDst, c.Dst)
			putSAFields(b, c, FieldNegotiated, true)
		}))
		u, err := readSAUpdate(m.Attrs)
		if err != nil || u.Fields != FieldNegotiated {
			t.Fatalf("SA_UPDATE: fields %b, %v", u.Fields, err)
		}
		cur := gcmConfig(t, c.SPI)
		cur.Negotiated = !v
		if got := u.Apply(cur); got.Negotiated != v {
			t.Errorf("SA_UPDATE with NEGOTIATED %v applied: %v", v, got.Negotiated)
		}
	}
	manual := gcmConfig(t, 0x78)
	for _, a := range decodeOK(t, encode(t, MsgSAAdd, 0, 1, func(b *Builder) { putSAConfig(b, manual, true) })).Attrs {
		if a.Type == AttrNegotiated {
			t.Error("NEGOTIATED sent for a manual state")
		}
	}
	if got, err := readSAAdd(decodeOK(t, encode(t, MsgSAAdd, 0, 1, func(b *Builder) { putSAConfig(b, manual, true) })).Attrs); err != nil || got.Negotiated {
		t.Errorf("SA_ADD without NEGOTIATED: negotiated %v, %v", got.Negotiated, err)
	}
}

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
		put  func(*Builder)
		code Errno
	}{
		{"value 2", func(b *Builder) { b.U32(AttrNegotiated, 2) }, EINVAL},
		{"2 bytes", func(b *Builder) { b.Raw(AttrNegotiated, []byte{0, 1}) }, EBADMSG},
		{"8 bytes", func(b *Builder) { b.U64(AttrNegotiated, 1) }, EBADMSG},
	} {
		_, err := c.do(ctx, MsgSAAdd, func(b *Builder) { putSAConfig(b, bad, true); tc.put(b) })
		var e *Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Attr != AttrNegotiated || !strings.Contains(e.Msg, "NEGOTIATED") {
			t.Errorf("%s: %v, want %v naming NEGOTIATED", tc.name, err, tc.code)
		}
		if _, ok := ts.db.GetSA(bad.SPI, bad.Dst); ok {
			t.Errorf("%s: state installed", tc.name)
		}
	}

	// SA_UPDATE: the same value is fine, another is refused.
	up := SAUpdate{SPI: neg.SPI, Dst: neg.Dst, Config: sa.Config{Negotiated: true, TTL: 7}, Fields: FieldNegotiated | FieldTTL}
	if err := c.UpdateSA(ctx, up); err != nil {
		t.Errorf("SA_UPDATE keeping NEGOTIATED: %v", err)
	}
	up.Config.Negotiated = false
	err = c.UpdateSA(ctx, up)
	var e *Error
	if !errors.As(err, &e) || e.Code != EINVAL || e.Attr != AttrNegotiated || !strings.Contains(e.Msg, "cannot change whether its keys were negotiated") {
		t.Errorf("SA_UPDATE turning a negotiated state manual: %v", err)
	}
	up = SAUpdate{SPI: manual.SPI, Dst: manual.Dst, Config: sa.Config{Negotiated: true}, Fields: FieldNegotiated}
	if err := c.UpdateSA(ctx, up); err == nil {
		t.Error("SA_UPDATE turning a manual state negotiated succeeded")
	}
	if s, _ := ts.db.GetSA(manual.SPI, manual.Dst); s.Config().Negotiated {
		t.Error("refused SA_UPDATE made the manual state negotiated")
	}
}
