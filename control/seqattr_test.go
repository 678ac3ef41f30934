package control

import (
	"bytes"
	"errors"
	"testing"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

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
	up := wire.SAUpdate{SPI: out.SPI, Dst: out.Dst, Config: sa.Config{OSeq: 1 << 40}, Fields: wire.FieldOSeq}
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
	upd := wire.SAUpdate{SPI: in.SPI, Dst: in.Dst, Config: sa.Config{ReplaySeq: 1<<32 + 101}, Fields: wire.FieldReplay}
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
		attr wire.AttrType
	}{
		{"oseq on an inbound state", func() sa.Config { c := plain; c.OSeq = 5; return c }, wire.AttrOSeq},
		{"replay-seq on an outbound state", func() sa.Config { c := fullConfig(t); c.SPI = 0x2001; c.ReplaySeq = 5; return c }, wire.AttrReplaySeq},
		{"oseq 2^32-1 without ESN", func() sa.Config {
			c := fullConfig(t)
			c.SPI, c.Suite.ESN, c.OSeq = 0x2002, false, 1<<32-1
			return c
		}, wire.AttrOSeq},
		{"replay-seq above 2^32-1 without ESN", func() sa.Config { c := plain; c.ReplaySeq = 1 << 32; return c }, wire.AttrReplaySeq},
		{"bitmap longer than the window", func() sa.Config { c := plain; c.ReplaySeq = 100; c.ReplayBitmap = make([]byte, 9); return c }, wire.AttrReplayBitmap},
		{"bitmap without replay-seq", func() sa.Config { c := plain; c.ReplayBitmap = []byte{1}; return c }, wire.AttrReplayBitmap},
	} {
		err := c.AddSA(ctx, tc.c())
		var e *wire.Error
		if !errors.As(err, &e) || e.Code != wire.EINVAL || e.Attr != tc.attr {
			t.Errorf("%s: %v (attr %v), want EINVAL naming attribute %d", tc.name, err, e, tc.attr)
		}
	}
	// The same through SA_UPDATE.
	err = c.UpdateSA(ctx, wire.SAUpdate{SPI: out.SPI, Dst: out.Dst, Config: sa.Config{ReplaySeq: 5}, Fields: wire.FieldReplay})
	var e *wire.Error
	if !errors.As(err, &e) || e.Code != wire.EINVAL || e.Attr != wire.AttrReplaySeq {
		t.Errorf("SA_UPDATE with replay state on an outbound state: %v", err)
	}
}
