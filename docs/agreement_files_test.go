package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// packagedPaths returns the dst of every entry of the nfpm configurations
// (../packaging/*.yaml), with whether it is a tree (a directory whose files
// come from a staged directory).
func packagedPaths(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("../packaging/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no nfpm configuration in ../packaging (%v)", err)
	}
	dsts := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		last := ""
		for _, line := range strings.Split(string(b), "\n") {
			trim := strings.TrimSpace(line)
			if d, ok := strings.CutPrefix(trim, "dst: "); ok {
				last = strings.TrimSpace(d)
				dsts[last] = false
			}
			if trim == "type: tree" && last != "" {
				dsts[last] = true
			}
		}
	}
	return dsts
}

// treeSources maps the trees espd.yaml installs to where build.sh takes
// their files from, relative to this directory (a name's first element
// picks the source: README.md, docs/..., examples/...).
var treeSources = map[string]func(rest string) string{
	"/usr/lib/systemd/system": func(rest string) string { return "../packaging/systemd/" + rest },
	"/usr/share/doc/espd": func(rest string) string {
		switch dir, file, _ := strings.Cut(rest, "/"); dir {
		case "docs":
			return file
		case "examples":
			return "../packaging/" + file
		case "copyright":
			return "../LICENSE"
		}
		return "../" + rest
	},
}

// TestDocPackagedFiles: every installed path of espd's that a page names
// (under /usr or /lib, outside /usr/local, with "espd" in it) is a file or
// directory the packages install, and every espd unit a page names is one
// of packaging/systemd. Paths under /etc are the administrator's and are
// not checked.
func TestDocPackagedFiles(t *testing.T) {
	dsts := packagedPaths(t)
	path := regexp.MustCompile("(?:^|[\\s`(\"'=])((?:/usr|/lib)/[A-Za-z0-9_.+/-]*espd[A-Za-z0-9_.+/-]*)")
	unit := regexp.MustCompile(`\b(espd[a-z-]*\.service)\b`)
	n := 0
	for name, page := range agreementPages(t) {
		for _, m := range path.FindAllStringSubmatch(page, -1) {
			p := strings.TrimRight(m[1], ".,:/")
			if strings.HasPrefix(p, "/usr/local/") {
				continue
			}
			n++
			if !packaged(dsts, strings.Replace(p, "/lib/systemd/", "/usr/lib/systemd/", 1)) {
				t.Errorf("%s names %s, which no package installs (packaging/*.yaml)", name, p)
			}
		}
		for _, m := range unit.FindAllStringSubmatch(page, -1) {
			n++
			if _, err := os.Stat("../packaging/systemd/" + m[1]); err != nil {
				t.Errorf("%s names %s, which packaging/systemd does not have", name, m[1])
			}
		}
	}
	if n < 20 {
		t.Errorf("found %d packaged paths and units in the pages: the reader has stopped finding them", n)
	}
}

// packaged reports whether p is a dst of dsts, a directory above one, or a
// file of a tree whose source has it.
func packaged(dsts map[string]bool, p string) bool {
	if _, ok := dsts[p]; ok {
		return true
	}
	for d, tree := range dsts {
		if strings.HasPrefix(d, p+"/") {
			return true
		}
		if rest, ok := strings.CutPrefix(p, d+"/"); ok && tree {
			if src, ok := treeSources[d]; ok {
				_, err := os.Stat(src(rest))
				return err == nil
			}
		}
	}
	return false
}

// TestPackaged pins packaged's reading of dsts and trees.
func TestPackaged(t *testing.T) {
	dsts := map[string]bool{"/usr/sbin/espd": false, "/usr/lib/systemd/system": true, "/usr/share/doc/espd": true}
	for p, want := range map[string]bool{
		"/usr/sbin/espd":                          true,
		"/usr/sbin/espd-pair":                     false,
		"/usr/lib/systemd/system/espd.service":    true,
		"/usr/lib/systemd/system/espd-no.service": false,
		"/usr/share/doc/espd/examples/espd.toml":  true,
		"/usr/share/doc/espd/docs/deploy.md":      true,
		"/usr/share/doc/espd/docs/nope.md":        false,
		"/usr/lib/systemd":                        true,
	} {
		if got := packaged(dsts, p); got != want {
			t.Errorf("packaged(%s) = %v, want %v", p, got, want)
		}
	}
}
