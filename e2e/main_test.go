package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Paths of the binaries TestMain builds.
var espdBin, espctlBin string

// TestMain builds ./cmd/espd and ./cmd/espctl into a temporary directory
// and fails the whole package, saying why, if they do not build.
func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "espd-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	espdBin = filepath.Join(dir, "espd")
	espctlBin = filepath.Join(dir, "espctl")
	for _, b := range []struct{ out, pkg string }{{espdBin, "./cmd/espd"}, {espctlBin, "./cmd/espctl"}} {
		if err := goBuild(b.out, b.pkg); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: cannot build %s, so no end-to-end test can run:\n%v\n", b.pkg, err)
			return 1
		}
	}
	// The binaries must be reachable by uid 65534 for the setpriv test.
	_ = os.Chmod(dir, 0o755)
	return m.Run()
}

// goBuild runs "go build -o out pkg" in the module root (the parent of
// this package's directory).
func goBuild(out, pkg string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, "build", "-o", out, pkg)
	cmd.Dir = ".."
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build -o %s %s: %w\n%s", out, pkg, err, strings.TrimSpace(string(b)))
	}
	return nil
}
