package wire

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/espd/espd/internal/docblock"
)

// TestDocExample checks the worked example of docs/control-protocol.md
// against the codec.
func TestDocExample(t *testing.T) {
	doc, err := docblock.Blocks("../../docs/control-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	hexByte := regexp.MustCompile(`^[0-9a-f]{2}$`)
	var blocks [][]byte
	for _, b := range docblock.Marked(doc, "worked example") {
		var msg []byte
		for _, line := range strings.Split(b.Text, "\n") {
			for _, tok := range strings.Fields(line) {
				if !hexByte.MatchString(tok) {
					break
				}
				x, _ := hex.DecodeString(tok)
				msg = append(msg, x...)
			}
		}
		blocks = append(blocks, msg)
	}
	want := [][]byte{
		encode(t, MsgSPIAlloc, 0, 7, func(b *Builder) { b.U32(AttrSPIMin, 0xc0000000); b.U32(AttrSPIMax, 0xcfffffff) }),
		encode(t, MsgSPIAlloc, FlagReply, 7, func(b *Builder) { b.U32(AttrSPI, 0xc3a5f00d) }),
		encode(t, MsgSADel, 0, 8, func(b *Builder) { b.U32(AttrSPI, 0xc3a5f00d); b.Addr(AttrDst, v4b) }),
		encode(t, MsgError, FlagReply, 8, func(b *Builder) {
			PutError(b, &Error{Code: ENOENT, Msg: "no such state", Type: MsgSADel})
		}),
	}
	if len(blocks) != len(want) {
		t.Fatalf("%d example blocks, want %d", len(blocks), len(want))
	}
	for i := range want {
		if !bytes.Equal(blocks[i], want[i]) {
			t.Errorf("example %d:\n doc % x\ncode % x", i, blocks[i], want[i])
		}
		if _, err := Decode(blocks[i]); err != nil {
			t.Errorf("example %d: %v", i, err)
		}
	}
}

// TestDocNumbers checks that docs/control-protocol.md has a table row for
// every message type and top-level attribute the codec names, with the
// codec's number: "| 0x0050 | PAIR_ROLE |", "| 89 | PAIR_ROLE |".
func TestDocNumbers(t *testing.T) {
	b, err := os.ReadFile("../../docs/control-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for typ, name := range msgNames {
		if row := fmt.Sprintf("| 0x%04x | %s |", uint16(typ), name); !strings.Contains(doc, row) {
			t.Errorf("docs/control-protocol.md has no row %q", row)
		}
	}
	for a, name := range attrNames[spaceTop] {
		if row := fmt.Sprintf("| %d | %s |", a, name); !strings.Contains(doc, row) {
			t.Errorf("docs/control-protocol.md has no row %q", row)
		}
	}
}
