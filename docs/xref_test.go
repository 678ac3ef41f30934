package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSectionReferences checks every reference to a section of a page,
// `docs/safety.md, "Fail closed"` in a doc comment or a page, against the
// page's headings (numbering like "7. " aside) and bold paragraph labels
// ("**Under charon.**"): a section that moves or is renamed takes its
// references with it.
func TestSectionReferences(t *testing.T) {
	ref := regexp.MustCompile(`((?:docs/)?(?:dev/)?[A-Za-z0-9-]+\.md),\s*(?:section\s*)?"([^"]+)"`)
	comment := regexp.MustCompile(`\n\s*//\s*`)
	space := regexp.MustCompile(`\s+`)
	anchors := map[string][]string{}
	anchorsOf := func(page string) ([]string, bool) {
		if a, ok := anchors[page]; ok {
			return a, a != nil
		}
		data, err := os.ReadFile(filepath.Join("..", page))
		if err != nil {
			anchors[page] = nil
			return nil, false
		}
		var a []string
		for _, line := range strings.Split(string(data), "\n") {
			if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
				a = append(a, regexp.MustCompile(`^[0-9.]+ `).ReplaceAllString(strings.TrimSpace(h), ""))
			}
			if label, _, ok := strings.Cut(strings.TrimPrefix(line, "**"), ".**"); ok && strings.HasPrefix(line, "**") {
				a = append(a, label)
			}
		}
		anchors[page] = a
		return a, true
	}
	n := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), "bench-out")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !(strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".md")) {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		text := space.ReplaceAllString(comment.ReplaceAllString(string(data), " "), " ")
		for _, m := range ref.FindAllStringSubmatch(text, -1) {
			page, section := m[1], m[2]
			if !strings.HasPrefix(page, "docs/") && page != "README.md" && page != "BENCHMARKS.md" && page != "DEVELOPERS.md" {
				page = "docs/" + page
			}
			n++
			a, ok := anchorsOf(page)
			if !ok {
				t.Errorf("%s: %s, %q: no such page", path, page, section)
				continue
			}
			found := false
			for _, h := range a {
				if h == section || strings.HasPrefix(h, section) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s: %s has no section %q", path, page, section)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Fatalf("only %d section references found: the pattern no longer matches how they are written", n)
	}
}
