package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	// killed: the test killed it (kill), so its exit is no failure.
	killed atomic.Bool
}

// startEspd starts espd in node with the standard flags plus extra, waits
// until its control socket answers and its TUN exists, and registers its
// stop (SIGTERM, checked for a clean exit) and, when the test failed, a dump
// of its log.
func startEspd(t testing.TB, node *testbed.Node, extra ...string) *espd {
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
		"--state-dir", stateDir(t, node),
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
		if err := e.proc.Stop(10 * time.Second); err != nil && !e.killed.Load() {
			t.Errorf("espd on %s: %v", node.Role, err)
		}
		if t.Failed() {
			t.Logf("espd on %s (%s) logged:\n%s", node.Role, strings.Join(argv[1:], " "), tail(e.proc.Log(), 120))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := testbed.WaitEspd(ctx, node, e.proc, e.sock, tunName); err != nil {
		t.Fatalf("espd on %s: %v\nlog:\n%s", node.Role, err, tail(e.proc.Log(), 60))
	}
	return e
}

// stateDirs holds each gateway's --state-dir, by node: one per gateway of
// a test, kept across its espd's restarts, as on a real gateway.
var stateDirs sync.Map // *testbed.Node -> string

// stateDir returns node's state directory (not created: espd makes it).
func stateDir(t testing.TB, node *testbed.Node) string {
	if d, ok := stateDirs.Load(node); ok {
		return d.(string)
	}
	d := filepath.Join(t.TempDir(), "state-"+node.Role)
	stateDirs.Store(node, d)
	t.Cleanup(func() { stateDirs.Delete(node) })
	return d
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
func (e *espd) mustCtl(t testing.TB, args ...string) string {
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
	return testbed.Espctl(prefix, espctlBin, sock, args...)
}

// logContains reports whether espd's log has a line matching all of subs.
func (e *espd) logContains(subs ...string) bool {
	return testbed.CountLines(e.proc.Log(), subs...) > 0
}

// tail returns the last n lines of s.
func tail(s string, n int) string { return testbed.Tail(s, n) }

// eventually polls cond every 50 ms until it holds or d passes.
func eventually(d time.Duration, cond func() bool) bool {
	return testbed.Poll(d, 50*time.Millisecond, cond)
}

// kill sends SIGKILL to espd and waits until it is gone.
func (e *espd) kill(t testing.TB) {
	t.Helper()
	p := e.proc
	e.killed.Store(true)
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("espd on %s survived SIGKILL", e.node.Role)
	}
	p.Stop(time.Second) // marks it stopped; its exit status is the kill
}

// term stops espd with SIGTERM and requires a clean exit.
func (e *espd) term(t *testing.T) {
	t.Helper()
	p := e.proc
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\nlog:\n%s", err, tail(p.Log(), 40))
	}
	if code, _ := p.ExitCode(); code != 0 {
		t.Fatalf("espd exit status %d after SIGTERM", code)
	}
}
