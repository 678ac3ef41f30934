package docs

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// TestPackagedExample holds the example configuration that the espd package
// ships (packaging/espd.toml, installed as
// /usr/share/doc/espd/examples/espd.toml) to the example of config.md: the
// same tables, keys and values, whatever the comments.
func TestPackagedExample(t *testing.T) {
	md, err := os.ReadFile("config.md")
	if err != nil {
		t.Fatal(err)
	}
	const heading = "## Example: gateway A of a site-to-site tunnel"
	_, rest, ok := strings.Cut(string(md), heading)
	if !ok {
		t.Fatalf("config.md has no %q", heading)
	}
	_, rest, ok = strings.Cut(rest, "```toml\n")
	if !ok {
		t.Fatalf("config.md: no toml block after %q", heading)
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("config.md: the example's toml block does not end")
	}
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
