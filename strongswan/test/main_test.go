package strongswantest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/espd/espd/testbed"
)

// Paths of what the tests run.
const (
	charonBin  = "/usr/lib/ipsec/charon"
	pluginPath = "/usr/lib/ipsec/plugins/libstrongswan-espd.so"
)

// pluginEnv names the environment variable that points the tests at a
// build of the plugin that is not installed (charon preloads it), e.g.
// ESPD_SS_PLUGIN=/tmp/build/libstrongswan-espd.so.
const pluginEnv = "ESPD_SS_PLUGIN"

// espdBin and espctlBin are built by TestMain (or, with ESPD_INSTALLED=1,
// the installed ones: testbed.EspdMain).
var espdBin, espctlBin string

// TestMain builds ./cmd/espd and ./cmd/espctl into a temporary directory
// and fails the whole package, saying why, if they do not build.
func TestMain(m *testing.M) {
	os.Exit(testbed.EspdMain(m, "strongswantest", &espdBin, &espctlBin))
}

// requireStrongSwan skips the test, saying why, unless charon, swanctl and
// the plugin are installed; in CI (CI=true), where .ci/run builds the
// plugin, their absence fails it. With ESPD_INSTALLED=1 a plugin that the
// strongswan-espd package did not install fails it too.
func requireStrongSwan(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network and mount namespaces, charon")
	}
	var missing []string
	plugin := pluginPath
	if p := os.Getenv(pluginEnv); p != "" {
		plugin = p
	}
	for _, p := range []string{charonBin, plugin} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	if _, err := exec.LookPath("swanctl"); err != nil {
		missing = append(missing, "swanctl")
	}
	if len(missing) == 0 && testbed.Installed() {
		// The plugin must be the strongswan-espd package's (README.md,
		// "Packages"), as espd and espctl are the espd package's.
		if out, err := exec.Command("dpkg-query", "-S", pluginPath).CombinedOutput(); err != nil ||
			!strings.HasPrefix(string(out), "strongswan-espd: ") {
			t.Fatalf("%s=1 but %s does not belong to the strongswan-espd package: %v\n%s",
				testbed.InstalledEnv, pluginPath, err, out)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("charon, swanctl or charon's espd plugin is not installed (missing %s): run ESPD_SS_TESTS=1 strongswan/build.sh as root (it also installs the stand-alone charon and kernel-libipsec the tests run)",
		strings.Join(missing, ", "))
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
