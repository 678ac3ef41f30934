package wire

import (
	"bytes"
	"encoding/hex"
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
