package wire

import (
	"reflect"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/sa"
)

// TestSAAddDefaults: an SA_ADD that leaves out the optional attributes
// (as a client that knows nothing of them would) reads as sa.DefaultConfig
// plus what it carries; the attributes it carries win, 0 included.
func TestSAAddDefaults(t *testing.T) {
	suite := crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128}
	required := func(b *Builder) {
		b.U32(AttrSPI, 0x1234)
		b.Addr(AttrSrc, v4a)
		b.Addr(AttrDst, v4b)
		b.U32(AttrDir, dirToWire[sa.DirIn])
		b.String(AttrAlgName, "aes128gcm16")
		b.Raw(AttrEncKey, make([]byte, 20))
	}
	want := sa.DefaultConfig()
	want.SPI, want.Dir, want.Src, want.Dst, want.Suite = 0x1234, sa.DirIn, v4a, v4b, suite
	want.EncKey, want.IntegKey = make([]byte, 20), []byte{}

	m := decode(t, encode(t, MsgSAAdd, 0, 1, required))
	got, err := ReadSAAdd(m.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("SA_ADD without optional attributes:\n got %#v\nwant %#v (sa.DefaultConfig)", fields(got), fields(want))
	}
	// Without MODE a state is tunnel mode, the default on every path.
	if got.Mode != sa.ModeTunnel {
		t.Fatalf("SA_ADD without MODE: mode %v, want tunnel", got.Mode)
	}

	m = decode(t, encode(t, MsgSAAdd, 0, 1, func(b *Builder) {
		required(b)
		b.U32(AttrReplayWindow, 0)
		b.Bool(AttrECN, false)
		b.U32(AttrDSCP, 46) // without COPY_DSCP: a fixed DSCP
		b.U32(AttrDF, dfToWire[esp.DFSet])
	}))
	got, err = ReadSAAdd(m.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	if got.ReplayWindow != 0 || got.ECN || got.CopyDSCP || got.DSCP != 46 || got.DF != esp.DFSet {
		t.Fatalf("explicit attributes lost: %#v", fields(got))
	}

	// SA_UPDATE: a DSCP alone turns copying off there too.
	cur := want
	cur.EncKey, cur.IntegKey = nil, nil
	upd := SAUpdate{Config: sa.Config{DSCP: 10}, Fields: FieldDSCP}.Apply(cur)
	if upd.CopyDSCP || upd.DSCP != 10 || upd.ReplayWindow != sa.DefaultReplayWindow || !upd.ECN {
		t.Fatalf("update with DSCP only: %#v", fields(upd))
	}
}

// fields shows every field of c (its String hides some).
func fields(c sa.Config) map[string]any {
	out := map[string]any{}
	v := reflect.ValueOf(c)
	for i := range v.NumField() {
		out[v.Type().Field(i).Name] = v.Field(i).Interface()
	}
	return out
}

func decode(t *testing.T, b []byte) *Message {
	t.Helper()
	m, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
