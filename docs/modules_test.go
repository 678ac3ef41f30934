package docs

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/espd/espd/internal/docblock"
)

// modules returns the directory, relative to the checkout's root, of
// every go.mod in the checkout ("." for the root's), testdata aside.
func modules(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == "go.mod" {
			rel, err := filepath.Rel("..", filepath.Dir(path))
			if err != nil {
				return err
			}
			dirs = append(dirs, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// TestEveryModuleTested fails when a module of the checkout is left out of
// go.work (so that `go run ./bench` would not build from the root, which
// it checks too) or out
// of any of the three commands of README.md's test command (a pattern such
// as ./... stops at a module's boundary, so a module the command does not
// name is neither vetted nor tested), or when .ci/run does not run that
// command verbatim.
func TestEveryModuleTested(t *testing.T) {
	mods := modules(t)
	if !slices.Contains(mods, ".") || len(mods) < 2 {
		t.Fatalf("modules found: %v; want the root's and bench's at least", mods)
	}

	out, err := exec.Command("go", "work", "edit", "-json", "../go.work").Output()
	if err != nil {
		t.Fatalf("go work edit -json ../go.work: %v", err)
	}
	var work struct{ Use []struct{ DiskPath string } }
	if err := json.Unmarshal(out, &work); err != nil {
		t.Fatal(err)
	}
	var used []string
	for _, u := range work.Use {
		used = append(used, filepath.ToSlash(filepath.Clean(u.DiskPath)))
	}

	// CONTRIBUTING.md's `go run ./bench`, from the root, compiles what this does.
	build := exec.Command("go", "build", "-o", filepath.Join(t.TempDir(), "bench"), "./bench")
	build.Dir = ".."
	build.Env = append(os.Environ(), "GOWORK=")
	if b, err := build.CombinedOutput(); err != nil {
		t.Errorf("go build ./bench from the root (CONTRIBUTING.md's go run ./bench): %v\n%s", err, b)
	}

	cmd, err := docblock.One("../README.md", "sh", "test-command")
	if err != nil {
		t.Fatal(err)
	}
	cmd = strings.TrimSpace(cmd)
	steps := strings.Split(cmd, " && ")
	if len(steps) != 3 {
		t.Fatalf("README's test command has %d steps, want vet, staticcheck and test:\n%s", len(steps), cmd)
	}
	for _, mod := range mods {
		if !slices.Contains(used, mod) {
			t.Errorf("go.work does not use the module in %s", mod)
		}
		pattern := "./" + mod + "/..."
		if mod == "." {
			pattern = "./..."
		}
		for _, step := range steps {
			if !slices.Contains(strings.Fields(step), pattern) {
				t.Errorf("README's test command does not name the module in %s (%s) in: %s", mod, pattern, step)
			}
		}
	}

	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Split(string(ci), "\n"), cmd) {
		t.Errorf(".ci/run does not run README's test command verbatim:\n%s", cmd)
	}
}
