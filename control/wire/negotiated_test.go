package wire

import (
	"testing"
)

// TestNegotiatedRoundTrip: NEGOTIATED survives SA_ADD, SA_UPDATE and an
// SA_GET reply; a manual state does not carry it.
func TestNegotiatedRoundTrip(t *testing.T) {
	cfg := gcmConfig(t, 0x77)
	cfg.Negotiated = true
	m := decodeOK(t, encode(t, MsgSAAdd, 0, 1, func(b *Builder) { putSAConfig(b, cfg, true) }))
	got, err := ReadSAAdd(m.Attrs)
	if err != nil || !got.Negotiated || !sameConfig(got, cfg) {
		t.Fatalf("SA_ADD round trip: %v (negotiated %v), %v", got, got.Negotiated, err)
	}
	info, err := ReadSAInfo(decodeOK(t, encode(t, MsgSAGet, FlagReply, 1, func(b *Builder) { PutSAInfo(b, SAInfo{Config: cfg}) })).Attrs)
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
		u, err := ReadSAUpdate(m.Attrs)
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
	if got, err := ReadSAAdd(decodeOK(t, encode(t, MsgSAAdd, 0, 1, func(b *Builder) { putSAConfig(b, manual, true) })).Attrs); err != nil || got.Negotiated {
		t.Errorf("SA_ADD without NEGOTIATED: negotiated %v, %v", got.Negotiated, err)
	}
}
