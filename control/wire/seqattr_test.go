package wire

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
		got, err := ReadSAAdd(m.Attrs)
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
		u, err := ReadSAUpdate(m.Attrs)
		if err != nil || u.Fields != f {
			t.Fatalf("fields %b: %b %v", f, u.Fields, err)
		}
		got := u.Apply(gcmConfig(t, cfg.SPI))
		if got.OSeq != cfg.OSeq*uint64(f&FieldOSeq/FieldOSeq) || (f == FieldReplay && (got.ReplaySeq != cfg.ReplaySeq || !bytes.Equal(got.ReplayBitmap, cfg.ReplayBitmap))) {
			t.Fatalf("fields %b applied: %v", f, got)
		}
	}
	in := SAInfo{Config: gcmConfig(t, 9), ReplayTop: 1<<64 - 1, ReplayBitmap: []byte{1, 2, 3, 4, 5, 6, 7, 8}}
	got, err := ReadSAInfo(decodeOK(t, encode(t, MsgSAGet, FlagReply, 1, func(b *Builder) { PutSAInfo(b, in) })).Attrs)
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
		_, err := ReadSAAdd(decodeOK(t, msg).Attrs)
		var e *Error
		if !errors.As(err, &e) || e.Code != EBADMSG || e.Attr != at {
			t.Errorf("attribute %d of 4 bytes: %v", at, err)
		}
	}
}
