package docs

import (
	"reflect"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/espd/espd/internal/docblock"
)

// TestPackagedExample holds the example configuration that the espd package
// ships (packaging/espd.toml, installed as
// /usr/share/doc/espd/examples/espd.toml) to the example of config.md: the
// same tables, keys and values, whatever the comments.
func TestPackagedExample(t *testing.T) {
	blocks, err := docblock.Blocks("config.md")
	if err != nil {
		t.Fatal(err)
	}
	m := docblock.Marked(blocks, "packaged example")
	if len(m) != 1 || m[0].Lang != "toml" {
		t.Fatalf("config.md: want one toml block marked \"packaged example\", have %d", len(m))
	}
	block := m[0].Text
	var documented, packaged map[string]any
	if _, err := toml.Decode(block, &documented); err != nil {
		t.Fatalf("config.md's example: %v", err)
	}
	if _, err := toml.DecodeFile("../packaging/espd.toml", &packaged); err != nil {
		t.Fatalf("packaging/espd.toml: %v", err)
	}
	if len(documented) == 0 {
		t.Fatal("config.md's example is empty")
	}
	if !reflect.DeepEqual(documented, packaged) {
		t.Errorf("packaging/espd.toml differs from config.md's example:\npackaged:   %v\ndocumented: %v", packaged, documented)
	}
}
