package control

import (
	"bytes"
	"errors"
	"testing"

	"github.com/espd/espd/sa"
)

// TestSeqAttrsRoundTrip: OSEQ, REPLAY_SEQ and REPLAY_BITMAP survive
// SA_ADD and SA_UPDATE at their largest values, and ST_REPLAY_BITMAP an
// SA_GET reply.
func TestSeqAttrsRoundTrip(t *testing.T) {
	for _, cfg := range []sa.Config{oseqConfig(t), replayConfig(t)} {
		m := decodeOK(t, encode(t, MsgSAAdd, 0, 1, func(b *Builder) { putSAConfig(b, cfg, true) }))
		got, err := readSAAdd(m.Attrs)
		if err != nil {
			t.Fatal(err)
		}
		if !sameConfig(got, cfg) {
			t.Fatalf("round trip:\n got %v\nwant %v", got, cfg)
		}
	}
	// Absent: not on the wire.
	msg := encode(t, MsgSAAdd, 0, 1, func(b *Builder) { putSAConfig(b, gcmConfig(t, 5), true) })
	for _, a := range decodeOK(t, msg).Attrs {
		if a.Type == AttrOSeq || a.Type == AttrReplaySeq || a.Type == AttrReplayBitmap {
			t.Errorf("attribute %d sent for a state without it", a.Type)
		}
	}
	for _, f := range []Fields{FieldOSeq, FieldReplay} {
		cfg := oseqConfig(t)
		if f == FieldReplay {
			cfg = replayConfig(t)
		}
		m := decodeOK(t, encode(t, MsgSAUpdate, 0, 1, func(b *Builder) {
			b.U32(AttrSPI, cfg.SPI)
			b.Addr(AttrDst, cfg.Dst)
			putSAFields(b, cfg, f, true)
		}))
		u, err := readSAUpdate(m.Attrs)
		if err != nil || u.Fields != f {
			t.Fatalf("fields %b: %b %v", f, u.Fields, err)
		}
		got := u.Apply(gcmConfig(t, cfg.SPI))
		if got.OSeq != cfg.OSeq*uint64(f&FieldOSeq/FieldOSeq) || (f == FieldReplay && (got.ReplaySeq != cfg.ReplaySeq || !bytes.Equal(got.ReplayBitmap, cfg.ReplayBitmap))) {
			t.Fatalf("fields %b applied: %v", f, got)
		}
	}
	in := SAInfo{Config: gcmConfig(t, 9), ReplayTop: 1<<64 - 1, ReplayBitmap: []byte{1, 2, 3, 4, 5, 6, 7, 8}}
	got, err := readSAInfo(decodeOK(t, encode(t, MsgSAGet, FlagReply, 1, func(b *Builder) { putSAInfo(b, in) })).Attrs)
	if err != nil || got.ReplayTop != in.ReplayTop || !bytes.Equal(got.ReplayBitmap, in.ReplayBitmap) {
		t.Fatalf("SA_GET reply: top %d bitmap %x err %v", got.ReplayTop, got.ReplayBitmap, err)
	}
}

// TestSeqAttrsWrongSize: a u64 attribute of another size is EBADMSG
// naming it.
func TestSeqAttrsWrongSize(t *testing.T) {
	for _, at := range []AttrType{AttrOSeq, AttrReplaySeq} {
		msg := encode(t, MsgSAAdd, 0, 1, func(b *Builder) {
			putSAConfig(b, gcmConfig(t, 5), true)
			b.U32(at, 5)
		})
		_, err := readSAAdd(decodeOK(t, msg).Attrs)
		var e *Error
		if !errors.As(err, &e) || e.Code != EBADMSG || e.Attr != at {
			t.Errorf("attribute %d of 4 bytes: %v", at, err)
		}
	}
}

// TestSeqAttrsServer sets and reads back oseq and replay state through a
// server over a real sa.DB, and checks the error replies name the
// attribute at fault.
func TestSeqAttrsServer(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := dial(t, ts.path)
	ctx := testCtx(t)

	out := oseqConfig(t)
	out.OSeq = 1<<32 - 3
	if err := c.AddSA(ctx, out); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetSA(ctx, out.SPI, out.Dst)
	if err != nil || got.Stats.SeqOut != 1<<32-3 || got.Config.OSeq != 0 {
		t.Fatalf("outbound: SeqOut %d config oseq %d err %v", got.Stats.SeqOut, got.Config.OSeq, err)
	}
	s, _ := ts.db.GetSA(out.SPI, out.Dst)
	if f, g := s.ReserveSeq(5); f != 1<<32-2 || g != 5 {
		t.Fatalf("first numbers %#x (%d)", f, g)
	}
	got, _ = c.GetSA(ctx, out.SPI, out.Dst)
	if got.Stats.SeqOut != 1<<32+2 {
		t.Fatalf("SeqOut after 5 packets %#x", got.Stats.SeqOut)
	}
	// SA_UPDATE raises, never lowers.
	up := SAUpdate{SPI: out.SPI, Dst: out.Dst, Config: sa.Config{OSeq: 1 << 40}, Fields: FieldOSeq}
	if err := c.UpdateSA(ctx, up); err != nil {
		t.Fatal(err)
	}
	up.Config.OSeq = 10
	if err := c.UpdateSA(ctx, up); err != nil {
		t.Fatal(err)
	}
	if got, _ = c.GetSA(ctx, out.SPI, out.Dst); got.Stats.SeqOut != 1<<40 {
		t.Fatalf("SeqOut after the updates %#x", got.Stats.SeqOut)
	}

	in := replayConfig(t)
	in.ReplaySeq = 1<<32 + 100
	if err := c.AddSA(ctx, in); err != nil {
		t.Fatal(err)
	}
	got, err = c.GetSA(ctx, in.SPI, in.Dst)
	if err != nil || got.ReplayTop != 1<<32+100 || len(got.ReplayBitmap) != 8 || got.ReplayBitmap[0] != 0x05 || got.ReplayBitmap[7] != 0x80 {
		t.Fatalf("inbound: top %#x bitmap %x err %v", got.ReplayTop, got.ReplayBitmap, err)
	}
	list, err := c.ListSAs(ctx)
	if err != nil || len(list) != 2 || !bytes.Equal(list[1].ReplayBitmap, got.ReplayBitmap) {
		t.Fatalf("SA_LIST: %v", err)
	}
	// An update merges: 2^32+101 seen too.
	upd := SAUpdate{SPI: in.SPI, Dst: in.Dst, Config: sa.Config{ReplaySeq: 1<<32 + 101}, Fields: FieldReplay}
	if err := c.UpdateSA(ctx, upd); err != nil {
		t.Fatal(err)
	}
	if got, _ = c.GetSA(ctx, in.SPI, in.Dst); got.ReplayTop != 1<<32+101 || got.ReplayBitmap[0]&0b11 != 0b11 {
		t.Fatalf("after the update: top %#x bitmap %x", got.ReplayTop, got.ReplayBitmap)
	}

	// Errors name the attribute.
	plain := gcmConfig(t, 0x2000)
	for _, tc := range []struct {
		name string
		c    func() sa.Config
		attr AttrType
	}{
		{"oseq on an inbound state", func() sa.Config { c := plain; c.OSeq = 5; return c }, AttrOSeq},
		{"replay-seq on an outbound state", func() sa.Config { c := fullConfig(t); c.SPI = 0x2001; c.ReplaySeq = 5; return c }, AttrReplaySeq},
		{"oseq 2^32-1 without ESN", func() sa.Config {
			c := fullConfig(t)
			c.SPI, c.Suite.ESN, c.OSeq = 0x2002, false, 1<<32-1
			return c
		}, AttrOSeq},
		{"replay-seq above 2^32-1 without ESN", func() sa.Config { c := plain; c.ReplaySeq = 1 << 32; return c }, AttrReplaySeq},
		{"bitmap longer than the window", func() sa.Config { c := plain; c.ReplaySeq = 100; c.ReplayBitmap = make([]byte, 9); return c }, AttrReplayBitmap},
		{"bitmap without replay-seq", func() sa.Config { c := plain; c.ReplayBitmap = []byte{1}; return c }, AttrReplayBitmap},
	} {
		err := c.AddSA(ctx, tc.c())
		var e *Error
		if !errors.As(err, &e) || e.Code != EINVAL || e.Attr != tc.attr {
			t.Errorf("%s: %v (attr %v), want EINVAL naming attribute %d", tc.name, err, e, tc.attr)
		}
	}
	// The same through SA_UPDATE.
	err = c.UpdateSA(ctx, SAUpdate{SPI: out.SPI, Dst: out.Dst, Config: sa.Config{ReplaySeq: 5}, Fields: FieldReplay})
	var e *Error
	if !errors.As(err, &e) || e.Code != EINVAL || e.Attr != AttrReplaySeq {
		t.Errorf("SA_UPDATE with replay state on an outbound state: %v", err)
	}
}
