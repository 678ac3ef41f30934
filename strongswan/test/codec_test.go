package strongswantest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control/wire"
)

// codecTool compiles testdata/codec.c with the plugin's codec.
func codecTool(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no C compiler (cc): strongswan/build.sh installs build-essential")
		}
		t.Skip("no C compiler (cc) to build the plugin's codec: run strongswan/build.sh")
	}
	bin := filepath.Join(t.TempDir(), "codec")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, cc, "-std=gnu11", "-O1", "-Wall", "-Werror", "-o", bin,
		"testdata/codec.c", "../espd_msg.c").CombinedOutput()
	if err != nil {
		t.Fatalf("compiling the C codec: %v\n%s", err, out)
	}
	return bin
}

func runCodec(t *testing.T, bin, mode, stdin string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, mode)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("codec %s: %v", mode, err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// attr returns the single attribute of type typ.
func attr(t *testing.T, attrs []wire.Attr, typ wire.AttrType) []byte {
	t.Helper()
	var v []byte
	n := 0
	for _, a := range attrs {
		if a.Type == typ {
			v = a.Value
			n++
		}
	}
	if n != 1 {
		t.Fatalf("attribute %d appears %d times", typ, n)
	}
	return v
}

func u32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }

// TestCCodecBuilds decodes what the plugin's C codec builds with the Go
// package that espd itself uses.
func TestCCodecBuilds(t *testing.T) {
	bin := codecTool(t)
	lines := runCodec(t, bin, "build", "")
	if len(lines) != 4 {
		t.Fatalf("codec build printed %d lines: %q", len(lines), lines)
	}
	raw, err := hex.DecodeString(lines[0])
	if err != nil {
		t.Fatal(err)
	}
	m, err := wire.Decode(raw)
	if err != nil {
		t.Fatalf("espd refuses the C SA_ADD: %v", err)
	}
	if m.Type != wire.MsgSAAdd || m.Seq != 0x01020304 || m.Flags != 0 || m.Version != 1 {
		t.Fatalf("header %+v", m)
	}
	key := make([]byte, 20)
	for i := range key {
		key[i] = byte(i + 1)
	}
	checks := []struct {
		typ  wire.AttrType
		want []byte
	}{
		{wire.AttrSPI, []byte{0xc1, 0x23, 0x45, 0x67}},
		{wire.AttrSrc, []byte{198, 18, 0, 1}},
		{wire.AttrDst, []byte{198, 18, 0, 2}},
		{wire.AttrDir, []byte{0, 0, 0, 2}},
		{wire.AttrEncAlg, []byte{0, 0, 0, 20}},
		{wire.AttrEncKeyLen, []byte{0, 0, 0, 128}},
		{wire.AttrEncKey, key},
		{wire.AttrESN, []byte{0, 0, 0, 1}},
		{wire.AttrEncap, []byte{0x11, 0x94, 0x11, 0x95}},
		{wire.AttrIfID, []byte{0, 0, 0, 42}},
	}
	for _, c := range checks {
		if got := attr(t, m.Attrs, c.typ); !bytes.Equal(got, c.want) {
			t.Errorf("attribute %d = %x, want %x", c.typ, got, c.want)
		}
	}
	sel, err := wire.ParseAttrs(attr(t, m.Attrs, wire.AttrSelector))
	if err != nil {
		t.Fatal(err)
	}
	src := attr(t, sel, wire.SelSrc)
	if p, ok := netip.AddrFromSlice(src[4:]); !ok || src[0] != 48 || netip.PrefixFrom(p, 48).String() != "2001:db8:1::/48" {
		t.Errorf("SEL_SRC %x", src)
	}
	if got := attr(t, sel, wire.SelDstPorts); !bytes.Equal(got, []byte{1, 0xbb, 1, 0xbb}) {
		t.Errorf("SEL_DST_PORTS %x", got)
	}
	lt, err := wire.ParseAttrs(attr(t, m.Attrs, wire.AttrLifeHard))
	if err != nil {
		t.Fatal(err)
	}
	if got := binary.BigEndian.Uint64(attr(t, lt, wire.LtBytes)); got != 1<<32 {
		t.Errorf("LT_BYTES %d", got)
	}
	if got := binary.BigEndian.Uint64(attr(t, lt, wire.LtAddTime)); got != 3600e9 {
		t.Errorf("LT_ADD_TIME %d", got)
	}

	raw, _ = hex.DecodeString(lines[1])
	m, err = wire.Decode(raw)
	if err != nil {
		t.Fatalf("espd refuses the C IKE_PACKET: %v", err)
	}
	if data := attr(t, m.Attrs, wire.AttrIKEData); len(data) != 33 || data[4] != 0x11 {
		t.Errorf("IKE_DATA %x", data)
	}
	if got := u32(attr(t, m.Attrs, wire.AttrIKEPorts)); got != 4500<<16|4500 {
		t.Errorf("IKE_PORTS %x", got)
	}
	if lines[2] != "deep 0" || lines[3] != "big 0" {
		t.Errorf("the C builder accepted a nesting too deep or a message too big: %q", lines[2:])
	}
}

// walk lists attributes as the C tool prints them.
func walk(t *testing.T, b []byte, path string, depth int, out *[]string) {
	attrs, err := wire.ParseAttrs(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range attrs {
		*out = append(*out, fmt.Sprintf("%s %d %d %x", path, a.Type, len(a.Value), a.Value))
		if depth == 0 && (a.Type == wire.AttrSAStats || a.Type == wire.AttrFlow || a.Type == wire.AttrSelector) {
			walk(t, a.Value, fmt.Sprintf("%s/%d", path, a.Type), 1, out)
		}
	}
}

// TestCCodecParses has the C codec parse what espd sends.
func TestCCodecParses(t *testing.T) {
	bin := codecTool(t)
	msgs := []func(*wire.Builder){
		func(b *wire.Builder) { // acquire event
			b.U32(wire.AttrEventType, 3)
			b.U64(wire.AttrEventTime, 1700000000123456789)
			b.Nest(wire.AttrSelector)
			b.Prefix(wire.SelSrc, netip.MustParsePrefix("198.18.1.0/24"))
			b.Prefix(wire.SelDst, netip.MustParsePrefix("198.18.2.0/24"))
			b.End()
			b.U32(wire.AttrReqID, 3)
			b.Nest(wire.AttrFlow)
			b.Addr(wire.FlSrc, netip.MustParseAddr("2001:db8:1::2"))
			b.Addr(wire.FlDst, netip.MustParseAddr("2001:db8:2::2"))
			b.U32(wire.FlProto, 17)
			b.U16Pair(wire.FlPorts, 1234, 53)
			b.End()
			b.U64(wire.AttrEventsLost, 5)
		},
		func(b *wire.Builder) { // SA_GET reply
			b.U32(wire.AttrSPI, 0xc0ffee01)
			b.String(wire.AttrAlgName, "chacha20poly1305")
			b.Nest(wire.AttrSAStats)
			b.U32(1, 2)
			b.U64(2, 12345)
			b.U64(3, 1<<40)
			b.U64(8, 1700000000000000000)
			b.End()
		},
		func(b *wire.Builder) { // IKE_PACKET with 33 bytes
			b.Addr(wire.AttrSrc, netip.MustParseAddr("198.18.0.2"))
			b.U16Pair(wire.AttrIKEPorts, 4500, 4500)
			b.Raw(wire.AttrIKEData, bytes.Repeat([]byte{0xab}, 33))
		},
	}
	types := []wire.MsgType{wire.MsgEvent, wire.MsgSAGet, wire.MsgIKEPacket}
	var in strings.Builder
	var want []string
	for i, fill := range msgs {
		b := wire.NewBuilder(wire.Version, types[i], wire.FlagReply, uint32(100+i))
		fill(b)
		raw, err := b.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&in, "%x\n", raw)
		want = append(want, fmt.Sprintf("msg %d %d %d", types[i], wire.FlagReply, 100+i))
		walk(t, raw[wire.HeaderLen:], "top", 0, &want)
	}
	// Broken framing: an attribute overrunning the message, a bad magic.
	fmt.Fprintf(&in, "%x\n", []byte{0xe5, 0xd0, 1, 1, 0, 0x13, 0, 0, 0, 0, 0, 24, 0, 0, 0, 1, 0, 20, 0, 1, 0, 0, 0, 1})
	want = append(want, "msg 19 1 1", "top bad")
	fmt.Fprintf(&in, "%x\n", []byte{0xe5, 0xd1, 1, 1, 0, 0x13, 0, 0, 0, 0, 0, 16, 0, 0, 0, 1})
	want = append(want, "header bad")

	got := runCodec(t, bin, "parse", in.String())
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("C parser output differs:\ngot:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
