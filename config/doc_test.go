package config

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/espd/espd/internal/docblock"
)

// TestDocExamples parses every TOML block of docs/config.md as espd does,
// key files included (made up here, 20 bytes: the examples use
// aes128gcm16), so that what the documentation shows is a file espd
// takes. docs/example_test.go holds the site-to-site example to the
// packaged one.
func TestDocExamples(t *testing.T) {
	all, err := docblock.Blocks("../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := regexp.MustCompile(`(?m)^\s*(?:enc|integ)_key_file\s*=\s*"([^"]+)"`)
	var blocks []string
	for _, b := range all {
		if b.Lang == "toml" {
			blocks = append(blocks, b.Text)
		}
	}
	for _, marker := range []string{"route-based example", "packaged example"} {
		if _, err := docblock.One("../docs/config.md", "toml", marker); err != nil {
			t.Error(err)
		}
	}
	var interfaces int
	for i, block := range blocks {
		dir := t.TempDir()
		for _, m := range keyFile.FindAllStringSubmatch(block, -1) {
			p := m[1]
			if !filepath.IsAbs(p) {
				p = filepath.Join(dir, p)
			}
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			writeKey(t, p, gcmKeyHex+"\n", 0o600)
		}
		f, err := Parse(filepath.Join(dir, "espd.toml"), []byte(block))
		if err != nil {
			t.Errorf("TOML block #%d: %v\n%s", i+1, err, block)
			continue
		}
		if len(f.SAs)+len(f.Policies)+len(f.Interfaces) == 0 {
			t.Errorf("TOML block #%d is empty", i+1)
		}
		for _, ifc := range f.Interfaces {
			interfaces++
			var sas, pols int
			for _, c := range f.SAs {
				if c.IfID == ifc.IfID {
					sas++
				}
			}
			for _, p := range f.Policies {
				if p.IfID == ifc.IfID {
					pols++
				}
			}
			if sas == 0 || pols == 0 {
				t.Errorf("TOML block #%d: interface %s (if_id %d) has %d SAs and %d policies", i+1, ifc.Name, ifc.IfID, sas, pols)
			}
		}
		f.Wipe()
	}
	if interfaces == 0 {
		t.Error("no TOML block of config.md declares an [[interface]]")
	}
}
