package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func decodeOK(t *testing.T, msg []byte) *Message {
	t.Helper()
	m, err := Decode(msg)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	return m
}

func TestHeaderLayout(t *testing.T) {
	msg := encode(t, MsgSAGet, FlagReply|FlagMulti, 0x01020304, func(b *Builder) { b.U32(AttrSPI, 0xAABBCCDD) })
	want := []byte{
		0xE5, 0xD0, 0x01, 0x03, 0x00, 0x13, 0x00, 0x00,
		0x00, 0x00, 0x00, 0x18, 0x01, 0x02, 0x03, 0x04,
		0x00, 0x08, 0x00, 0x01, 0xAA, 0xBB, 0xCC, 0xDD,
	}
	if !bytes.Equal(msg, want) {
		t.Fatalf("got % x\nwant % x", msg, want)
	}
	m := decodeOK(t, msg)
	if m.Version != 1 || m.Type != MsgSAGet || m.Flags != FlagReply|FlagMulti || m.Seq != 0x01020304 ||
		len(m.Attrs) != 1 || m.Attrs[0].Type != AttrSPI {
		t.Fatalf("decoded %+v", m)
	}
}

func TestAttrPaddingAndNesting(t *testing.T) {
	msg := encode(t, MsgSAAdd, 0, 1, func(b *Builder) {
		b.String(AttrAlgName, "aes") // 3 bytes: length 7, padded to 8
		b.Nest(AttrSelector)
		b.Prefix(SelSrc, netip.MustParsePrefix("198.18.0.0/15"))
		b.U32(SelProto, 6)
		b.End()
	})
	if len(msg)%4 != 0 {
		t.Fatalf("length %d not aligned", len(msg))
	}
	m := decodeOK(t, msg)
	if got := string(m.Attrs[0].Value); got != "aes" {
		t.Fatalf("string %q", got)
	}
	if l := binary.BigEndian.Uint16(msg[16:]); l != 7 {
		t.Fatalf("string attribute length %d, want 7 (without padding)", l)
	}
	if l := binary.BigEndian.Uint16(msg[24:]); l != 4+12+8 {
		t.Fatalf("nested length %d, want %d", l, 4+12+8)
	}
	r := newReader(m.Attrs)
	s := readSelector(r, m.Attrs[1])
	if r.err != nil || s.Src != netip.MustParsePrefix("198.18.0.0/15") || s.Proto != 6 || s.Dst.IsValid() {
		t.Fatalf("selector %v err %v", s, r.err)
	}
}

// TestDecodeRejects checks that malformed input is refused with an error
// naming the problem.
func TestDecodeRejects(t *testing.T) {
	good := encode(t, MsgSAGet, 0, 1, func(b *Builder) { b.U32(AttrSPI, 1); b.Addr(AttrDst, v4a) })
	mod := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	setLen := func(b []byte, n uint32) []byte { binary.BigEndian.PutUint32(b[8:], n); return b }
	cases := []struct {
		name string
		msg  []byte
		want string
	}{
		{"empty", nil, "truncated header"},
		{"short header", good[:10], "truncated header"},
		{"bad magic", mod(func(b []byte) []byte { b[0] = 0x45; return b }), "bad magic"},
		{"length below header", mod(func(b []byte) []byte { return setLen(b, 8) }), "shorter than"},
		{"misaligned length", mod(func(b []byte) []byte { return setLen(b, 22) }), "multiple of 4"},
		{"oversized", mod(func(b []byte) []byte { return setLen(b, MaxMessageSize+4) }), "exceeds the maximum"},
		{"truncated body", good[:len(good)-4], "truncated message"},
		{"trailing bytes", append(bytes.Clone(good), 0, 0, 0, 0), "bytes given"},
		{"reserved", mod(func(b []byte) []byte { b[7] = 1; return b }), "reserved"},
		{"attr length < 4", mod(func(b []byte) []byte { b[17] = 2; return b }), "shorter than its header"},
		{"attr overrun", mod(func(b []byte) []byte { b[17] = 200; return b }), "overruns"},
		{"padding overrun", mod(func(b []byte) []byte { // SPI attr of length 5: its padding needs 3 more bytes than there are
			b = b[:24]
			b[17] = 5
			return setLen(b, 24)
		}), "padding"},
		{"nonzero padding", append(mod(func(b []byte) []byte { return setLen(b, uint32(len(b)+8)) }), 0, 5, 0, 99, 1, 2, 3, 4), "non-zero padding"},
		{"stray bytes", append(mod(func(b []byte) []byte { return setLen(b, uint32(len(b)+4)) }), 0, 0, 1, 0), "shorter than its header"},
	}
	for _, c := range cases {
		_, err := Decode(c.msg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	if _, err := Decode(good); err != nil {
		t.Fatalf("good message: %v", err)
	}
}

func TestBuilderLimits(t *testing.T) {
	b := NewBuilder(Version, MsgSAAdd, 0, 1)
	b.Raw(AttrEncKey, make([]byte, 70000))
	if _, err := b.Bytes(); err == nil || !strings.Contains(err.Error(), "do not fit") {
		t.Fatalf("oversized attribute: %v", err)
	}
	b = NewBuilder(Version, MsgSAAdd, 0, 1)
	for range 20 {
		b.Raw(AttrEncKey, make([]byte, 4000))
	}
	var e *Error
	if _, err := b.Bytes(); !errors.As(err, &e) || e.Code != EMSGSIZE {
		t.Fatalf("oversized message: %v", err)
	}
	b = NewBuilder(Version, MsgSAAdd, 0, 1)
	b.Nest(AttrSelector)
	if _, err := b.Bytes(); err == nil {
		t.Fatal("open nest accepted")
	}
}
