package wire

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/espd/espd/control/wire/wiretest"
	"github.com/espd/espd/sa"
)

// modeAttrs returns the values of the MODE attributes of msg.
func modeAttrs(t *testing.T, msg []byte) []uint32 {
	t.Helper()
	var out []uint32
	for _, a := range decodeOK(t, msg).Attrs {
		if a.Type == AttrMode {
			if len(a.Value) != 4 {
				t.Fatalf("MODE of %d bytes", len(a.Value))
			}
			out = append(out, binary.BigEndian.Uint32(a.Value))
		}
	}
	return out
}

// TestSAModeRoundTrip: a transport-mode state travels as MODE 1 in
// SA_ADD (whole and partial), SA_UPDATE and the SA_GET reply, and reads
// back as sa.ModeTransport; a tunnel-mode state as MODE 2; an SA_ADD or
// SA_GET reply without MODE reads as tunnel mode.
func TestSAModeRoundTrip(t *testing.T) {
	tr := wiretest.TransportConfig(t, 0x3001)
	tun := gcmConfig(t, 0x3002)
	for _, tc := range []struct {
		cfg  sa.Config
		wire uint32
	}{{tr, ModeTransport}, {tun, ModeTunnel}} {
		msg := encode(t, MsgSAAdd, 0, 1, func(b *Builder) { PutSAAdd(b, tc.cfg) })
		if got := modeAttrs(t, msg); len(got) != 1 || got[0] != tc.wire {
			t.Errorf("%v: SA_ADD carries MODE %v, want [%d]", tc.cfg.Mode, got, tc.wire)
		}
		got, err := ReadSAAdd(decodeOK(t, msg).Attrs)
		if err != nil || !sameConfig(got, tc.cfg) || got.Mode != tc.cfg.Mode {
			t.Errorf("%v: SA_ADD read back as %v (%v)", tc.cfg.Mode, got, err)
		}

		msg = encode(t, MsgSAGet, FlagReply, 1, func(b *Builder) { PutSAInfo(b, SAInfo{Config: tc.cfg}) })
		if got := modeAttrs(t, msg); len(got) != 1 || got[0] != tc.wire {
			t.Errorf("%v: SA_GET reply carries MODE %v, want [%d]", tc.cfg.Mode, got, tc.wire)
		}
		in, err := ReadSAInfo(decodeOK(t, msg).Attrs)
		if err != nil || in.Config.Mode != tc.cfg.Mode {
			t.Errorf("%v: SA_GET reply read back as %v (%v)", tc.cfg.Mode, in.Config.Mode, err)
		}
	}

	// A partial SA_ADD carries MODE only with FieldMode; without it the
	// state is tunnel mode, as without any other optional attribute.
	req := FieldSrc | FieldDst | FieldDir | FieldSuite | FieldKeys
	for _, tc := range []struct {
		f    Fields
		want []uint32
		mode sa.Mode
	}{{req, nil, sa.ModeTunnel}, {req | FieldMode, []uint32{ModeTransport}, sa.ModeTransport}} {
		msg := encode(t, MsgSAAdd, 0, 1, func(b *Builder) { PutSAAddFields(b, tr, tc.f) })
		if got := modeAttrs(t, msg); len(got) != len(tc.want) || (len(got) == 1 && got[0] != tc.want[0]) {
			t.Errorf("fields %b: MODE %v, want %v", tc.f, got, tc.want)
		}
		got, err := ReadSAAdd(decodeOK(t, msg).Attrs)
		if err != nil || got.Mode != tc.mode {
			t.Errorf("fields %b: mode %v (%v), want %v", tc.f, got.Mode, err, tc.mode)
		}
	}

	// SA_UPDATE: MODE travels with FieldMode only, and Apply sets it.
	for _, f := range []Fields{FieldMode, FieldTTL} {
		msg := encode(t, MsgSAUpdate, 0, 1, func(b *Builder) { PutSAUpdate(b, SAUpdate{SPI: tr.SPI, Dst: tr.Dst, Config: tr, Fields: f}) })
		u, err := ReadSAUpdate(decodeOK(t, msg).Attrs)
		if err != nil || u.Fields != f {
			t.Fatalf("SA_UPDATE fields %b: read %b (%v)", f, u.Fields, err)
		}
		cur := tun
		cur.EncKey = nil
		want := sa.ModeTunnel
		if f&FieldMode != 0 {
			want = sa.ModeTransport
		}
		if got := u.Apply(cur).Mode; got != want {
			t.Errorf("SA_UPDATE fields %b applied to a tunnel-mode state: mode %v, want %v", f, got, want)
		}
	}
}

// TestModeUnknownValue: a MODE that is neither 1 nor 2 is EINVAL naming
// MODE, in a state (SA_ADD, SA_UPDATE) and in a policy, never a panic or
// a silent default.
func TestModeUnknownValue(t *testing.T) {
	tr := wiretest.TransportConfig(t, 0x3001)
	for _, v := range []uint32{0, 3, 0xFFFFFFFF} {
		for name, read := range map[string]func() error{
			"SA_ADD": func() error {
				_, err := ReadSAAdd(decodeOK(t, encode(t, MsgSAAdd, 0, 1, func(b *Builder) {
					PutSAAddFields(b, tr, FieldSrc|FieldDst|FieldDir|FieldSuite|FieldKeys)
					b.U32(AttrMode, v)
				})).Attrs)
				return err
			},
			"SA_UPDATE": func() error {
				_, err := ReadSAUpdate(decodeOK(t, encode(t, MsgSAUpdate, 0, 1, func(b *Builder) {
					PutSAID(b, tr.SPI, tr.Dst)
					b.U32(AttrMode, v)
				})).Attrs)
				return err
			},
			"POLICY_ADD": func() error {
				_, err := ReadPolicy(decodeOK(t, encode(t, MsgPolicyAdd, 0, 1, func(b *Builder) {
					PutPolicy(b, fullPolicy())
					b.U32(AttrMode, v)
				})).Attrs)
				return err
			},
		} {
			var e *Error
			if err := read(); !errors.As(err, &e) || e.Code != EINVAL || e.Attr != AttrMode {
				t.Errorf("%s with MODE %d: %v, want EINVAL naming MODE", name, v, err)
			}
		}
	}
}

// TestPolicyModeRoundTrip: a transport-mode template travels as MODE 1 in
// the policy messages and the acquire event, a tunnel-mode one without
// MODE (as before MODE was read there); MODE 2 and no MODE both read as
// tunnel mode.
func TestPolicyModeRoundTrip(t *testing.T) {
	p := wiretest.TransportPolicy()
	msg := encode(t, MsgPolicyAdd, 0, 1, func(b *Builder) { PutPolicy(b, p) })
	if got := modeAttrs(t, msg); len(got) != 1 || got[0] != ModeTransport {
		t.Errorf("transport policy carries MODE %v, want [1]", got)
	}
	if got, err := ReadPolicy(decodeOK(t, msg).Attrs); err != nil || got != p {
		t.Errorf("transport policy read back as %v (%v), want %v", got, err, p)
	}

	tun := fullPolicy()
	msg = encode(t, MsgPolicyAdd, 0, 1, func(b *Builder) { PutPolicy(b, tun) })
	if got := modeAttrs(t, msg); len(got) != 0 {
		t.Errorf("tunnel policy carries MODE %v", got)
	}
	if got, err := ReadPolicy(decodeOK(t, msg).Attrs); err != nil || got.Mode != sa.ModeTunnel {
		t.Errorf("policy without MODE: %v (%v)", got, err)
	}
	msg = encode(t, MsgPolicyAdd, 0, 1, func(b *Builder) { PutPolicy(b, tun); b.U32(AttrMode, ModeTunnel) })
	if got, err := ReadPolicy(decodeOK(t, msg).Attrs); err != nil || got != tun {
		t.Errorf("policy with MODE 2: %v (%v), want %v", got, err, tun)
	}

	e := Event{Kind: EventAcquire, Dst: p.TmplDst, Dir: p.Dir, ReqID: p.ReqID, Policy: p}
	got, err := ReadEvent(decodeOK(t, encode(t, MsgEvent, 0, 1, func(b *Builder) { PutEvent(b, e) })).Attrs)
	if err != nil || got.Policy.Mode != sa.ModeTransport {
		t.Errorf("acquire of a transport policy: %v (%v)", got.Policy, err)
	}
}
