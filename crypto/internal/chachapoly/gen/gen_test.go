package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedFilesCurrent runs the generator as go generate does and
// compares its output, but for the first line, with the committed
// chachapoly_amd64.s and stub_amd64.go: the assembly espd builds is what
// this generator makes.
func TestGeneratedFilesCurrent(t *testing.T) {
	dir := t.TempDir()
	out, stubs := filepath.Join(dir, "chachapoly_amd64.s"), filepath.Join(dir, "stub_amd64.go")
	cmd := exec.Command("go", "run", ".", "-out", out, "-stubs", stubs, "-pkg", "chachapoly")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run .: %v\n%s", err, b)
	}
	for _, f := range []string{out, stubs} {
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("..", filepath.Base(f)))
		if err != nil {
			t.Fatal(err)
		}
		// The first line names the command, with its output paths.
		_, got, _ = bytes.Cut(got, []byte("\n"))
		_, want, _ = bytes.Cut(want, []byte("\n"))
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what the generator makes: run go generate in crypto/internal/chachapoly", filepath.Base(f))
		}
	}
}
