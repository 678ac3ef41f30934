package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/espd/espd/internal/docblock"
)

// markerExempt are the test sources whose string literals do not count as
// running a document's blocks: the parser's own fixtures, and this file.
var markerExempt = []string{"internal/docblock/", "docs/markers_test.go"}

// testSources returns the text of every _test.go file of the repository
// (root: ".."), but markerExempt's.
func testSources(t *testing.T) string {
	t.Helper()
	var all strings.Builder
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(path, ".."+string(filepath.Separator)))
		if d.IsDir() {
			if path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		for _, ex := range markerExempt {
			if strings.HasPrefix(rel, ex) {
				return nil
			}
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		all.Write(b)
		all.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return all.String()
}

// usesMarker reports whether src holds marker as a Go string literal, alone
// or after the block's language ("sh gateway A"), interpreted or raw.
func usesMarker(src, lang, marker string) bool {
	for _, s := range []string{marker, lang + " " + marker} {
		if strings.Contains(src, strconv.Quote(s)) || strings.Contains(src, "`"+s+"`") {
			return true
		}
	}
	return false
}

// TestMarkersAreRun checks that every marked fenced block ("```sh
// MARKER") and every marked table ("<!-- table MARKER -->") of README.md
// and docs/*.md names a marker that some test of the repository uses as a
// string literal: a marker that no test selects marks a block or a table
// that nothing holds to the code, which is what a marker must never mean.
func TestMarkersAreRun(t *testing.T) {
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{"../README.md"}, docs...)
	src := testSources(t)
	seen := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, bl := range docblock.Parse(string(b)) {
			if bl.Marker == "" {
				continue
			}
			seen++
			if !usesMarker(src, bl.Lang, bl.Marker) {
				t.Errorf("%s:%d: block marked %q (%q), which no _test.go file uses", doc, bl.Line, bl.Marker, bl.Lang+" "+bl.Marker)
			}
		}
		for _, tb := range docblock.Tables(string(b)) {
			if tb.Marker == "" {
				continue
			}
			seen++
			if !usesMarker(src, "", tb.Marker) {
				t.Errorf("%s:%d: table marked %q, which no _test.go file uses", doc, tb.Line, tb.Marker)
			}
		}
	}
	if seen == 0 {
		t.Fatal("README.md and docs/*.md have no marked block or table: the check checks nothing")
	}
}
