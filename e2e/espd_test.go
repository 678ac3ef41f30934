package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// tunName is the TUN device every espd of these tests creates.
const tunName = "esp0"

// espd is one daemon running in a gateway namespace.
type espd struct {
	node *testbed.Node
	dir  string // holds the socket, the log and config files
	sock string
	proc *testbed.Process
}

// startEspd starts espd in node with the standard flags plus extra, waits
// until its control socket answers and its TUN exists, and registers its
// stop (SIGTERM, checked for a clean exit) and, when the test failed, a dump
// of its log.
func startEspd(t *testing.T, node *testbed.Node, extra ...string) *espd {
	t.Helper()
	dir, err := os.MkdirTemp("", "espd-e2e-"+node.Role+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &espd{node: node, dir: dir, sock: filepath.Join(dir, "espd.sock")}
	argv := append([]string{espdBin,
		"--tun", tunName,
		"--socket", e.sock,
		"--workers", "2",
		"--udp-port", "4500",
		"--log-format", "text",
		"--log-level", "debug",
	}, extra...)
	e.proc, err = node.Start(filepath.Join(dir, "espd.log"), argv...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.proc.Stop(10 * time.Second); err != nil {
			t.Errorf("espd on %s: %v", node.Role, err)
		}
		if t.Failed() {
			t.Logf("espd on %s (%s) logged:\n%s", node.Role, strings.Join(argv[1:], " "), tail(e.proc.Log(), 120))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.waitReady(ctx); err != nil {
		t.Fatalf("espd on %s: %v\nlog:\n%s", node.Role, err, tail(e.proc.Log(), 60))
	}
	return e
}

// waitReady waits until the control socket accepts connections and the TUN
// exists.
func (e *espd) waitReady(ctx context.Context) error {
	for {
		if done, err := e.proc.Exited(); done {
			return fmt.Errorf("exited during start: %v", err)
		}
		c, err := net.DialTimeout("unix", e.sock, time.Second)
		if err == nil {
			c.Close()
			if _, err := e.node.IP(ctx, "link", "show", "dev", tunName); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready (socket %s, TUN %s): %w", e.sock, tunName, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// alive fails the test if espd has exited.
func (e *espd) alive(t *testing.T) {
	t.Helper()
	if done, err := e.proc.Exited(); done {
		t.Fatalf("espd on %s exited: %v\nlog:\n%s", e.node.Role, err, tail(e.proc.Log(), 60))
	}
}

// ctl runs "espctl -s SOCK args..." in the root namespace (the socket is a
// file) with a bound and returns its combined output.
func (e *espd) ctl(args ...string) (string, error) {
	return runEspctl(nil, e.sock, args...)
}

// mustCtl is ctl that fails the test on error.
func (e *espd) mustCtl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.ctl(args...)
	if err != nil {
		t.Fatalf("espctl on %s %s: %v\n%s", e.node.Role, strings.Join(args, " "), err, out)
	}
	return out
}

// runEspctl runs espctl against sock; prefix, if set, goes before the
// binary (setpriv ...).
func runEspctl(prefix []string, sock string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	argv := append(append(append([]string{}, prefix...), espctlBin, "-s", sock), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%v (%v)", err, ctx.Err())
	}
	return string(out), err
}

// logContains reports whether espd's log has a line matching all of subs.
func (e *espd) logContains(subs ...string) bool {
	for line := range strings.SplitSeq(e.proc.Log(), "\n") {
		ok := true
		for _, s := range subs {
			if !strings.Contains(line, s) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines before)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// eventually polls cond every 50 ms until it holds or d passes.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}
