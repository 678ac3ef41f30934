package testbed

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// secretDirs are the directories a document's secret block writes into;
// RunFileBlock puts each into a directory of the test's.
var secretDirs = []string{"/etc/swanctl/conf.d/", "/etc/strongswan.d/", "/etc/ppp/"}

// secretLine is the "secret = VALUE" line of a swanctl or strongswan.conf
// secrets section.
var secretLine = regexp.MustCompile(`(?m)^\s*secret\s*=\s*(\S+)\s*$`)

// RunFileBlock runs a document's block that writes one file holding a
// fresh secret (a key, a password), as written but for its directories
// (secretDirs), which are the test's, and returns what the block wrote. The
// file must be readable by its owner alone: anything else fails the test.
func RunFileBlock(t testing.TB, block string) string {
	t.Helper()
	dir := t.TempDir()
	script := block
	for _, d := range secretDirs {
		script = strings.ReplaceAll(script, d, dir+"/")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "sh", "-e", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("the secret block: %v\n%s\n%s", err, out, block)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil || len(files) != 1 {
		t.Fatalf("the secret block wrote %v (%v), want one file:\n%s", files, err, block)
	}
	fi, err := os.Stat(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		t.Fatalf("the secret block's %s has mode %v, want no access for group and others", filepath.Base(files[0]), fi.Mode().Perm())
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// RunSecretBlock runs a document's block that writes a swanctl secrets
// section or a strongswan.conf section with a fresh key (RunFileBlock), and
// returns the file and the value of its one secret line, which must be at
// least 32 characters long.
func RunSecretBlock(t testing.TB, block string) (text, secret string) {
	t.Helper()
	text = RunFileBlock(t, block)
	m := secretLine.FindAllStringSubmatch(text, -1)
	if len(m) != 1 || len(strings.Trim(m[0][1], `"`)) < 32 {
		t.Fatalf("the secret block's file has %d secret lines, want one of at least 32 characters:\n%s", len(m), text)
	}
	return text, m[0][1]
}
