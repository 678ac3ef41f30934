package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/espd/espd/testbed"
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
	for _, b := range []struct{ out, pkg string }{{espdBin, "github.com/espd/espd/cmd/espd"}, {espctlBin, "github.com/espd/espd/cmd/espctl"}} {
		if err := testbed.GoBuild(b.out, b.pkg); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: cannot build %s, so no end-to-end test can run:\n%v\n", b.pkg, err)
			return 1
		}
	}
	// The binaries must be reachable by uid 65534 for the setpriv test.
	_ = os.Chmod(dir, 0o755)
	return m.Run()
}
