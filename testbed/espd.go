package testbed

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Import paths of the binaries EspdMain builds.
const (
	EspdPackage   = "github.com/espd/espd/cmd/espd"
	EspctlPackage = "github.com/espd/espd/cmd/espctl"
)

// The installed binaries, and the environment variable that selects them.
// With ESPD_INSTALLED=1 EspdMain tests the espd and espctl that the espd
// package installed (README.md, "Packages") instead of building them.
const (
	InstalledEnv    = "ESPD_INSTALLED"
	InstalledEspd   = "/usr/sbin/espd"
	InstalledEspctl = "/usr/bin/espctl"
)

// Installed reports whether InstalledEnv is set to 1.
func Installed() bool { return os.Getenv(InstalledEnv) == "1" }

// EspctlTimeout bounds one run of Espctl.
const EspctlTimeout = 20 * time.Second

// EspdMain is the body of the TestMain of a package whose tests run espd
// and espctl:
//
//	func TestMain(m *testing.M) { os.Exit(testbed.EspdMain(m, "e2e", &espdBin, &espctlBin)) }
//
// It builds EspdPackage and EspctlPackage with GoBuild into a new temporary
// directory, sets *espd and *espctl to the binaries' paths, runs m (a
// *testing.M) and removes the directory; it returns the exit code for
// os.Exit. The directory is made searchable by everyone (0755) so that a
// test can run the binaries as another user (setpriv). If a binary does
// not build, EspdMain prints why on stderr, prefixed with name, and returns
// 1 without running any test. With Installed, it builds nothing and sets
// *espd and *espctl to InstalledEspd and InstalledEspctl, which must exist.
func EspdMain(m interface{ Run() int }, name string, espd, espctl *string) int {
	if Installed() {
		*espd, *espctl = InstalledEspd, InstalledEspctl
		for _, p := range []string{*espd, *espctl} {
			if _, err := os.Stat(p); err != nil {
				fmt.Fprintf(os.Stderr, "%s: %s=1 but %v, so none of the package's tests can run\n", name, InstalledEnv, err)
				return 1
			}
		}
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "espd-"+name+"-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	defer os.RemoveAll(dir)
	*espd = filepath.Join(dir, "espd")
	*espctl = filepath.Join(dir, "espctl")
	for _, b := range []struct{ out, pkg string }{{*espd, EspdPackage}, {*espctl, EspctlPackage}} {
		if err := GoBuild(b.out, b.pkg); err != nil {
			fmt.Fprintf(os.Stderr, "%s: cannot build %s, so none of the package's tests can run:\n%v\n", name, b.pkg, err)
			return 1
		}
	}
	_ = os.Chmod(dir, 0o755)
	return m.Run()
}

// WaitEspd waits until espd, started in n as p (Node.Start) with
// "--socket sock --tun tun", is ready: its control socket accepts a
// connection and the TUN device exists in n. It polls every 50 ms and
// returns an error if p exits first or ctx ends first.
func WaitEspd(ctx context.Context, n *Node, p *Process, sock, tun string) error {
	for {
		if done, err := p.Exited(); done {
			return fmt.Errorf("exited during start: %v", err)
		}
		if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
			c.Close()
			if _, err := n.IP(ctx, "link", "show", "dev", tun); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready (socket %s, TUN %s): %w", sock, tun, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Espctl runs the espctl binary bin as "bin -s sock args..." within
// EspctlTimeout and returns its combined output. prefix, if set, goes
// before bin (a command that execs the rest, such as setpriv ...). It runs
// in the caller's namespace: the control socket is a file. The error of a
// run cut off by the timeout says so.
func Espctl(prefix []string, bin, sock string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), EspctlTimeout)
	defer cancel()
	argv := append(append(append([]string{}, prefix...), bin, "-s", sock), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%v (%v)", err, ctx.Err())
	}
	return string(out), err
}
