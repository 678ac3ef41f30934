package e2e

import (
	"os"
	"testing"

	"github.com/espd/espd/testbed"
)

// Paths of the binaries TestMain builds.
var espdBin, espctlBin string

// TestMain builds ./cmd/espd and ./cmd/espctl into a temporary directory
// (reachable by uid 65534 for the setpriv test) and fails the whole
// package, saying why, if they do not build.
func TestMain(m *testing.M) {
	os.Exit(testbed.EspdMain(m, "e2e", &espdBin, &espctlBin))
}
