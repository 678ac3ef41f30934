package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/testbed"
)

// The markers of docs/reference.md's quick start blocks ("```sh quick-start keys").
const (
	quickStartKeys = "quick-start keys"
	quickStartA    = "quick-start gateway A"
	quickStartB    = "quick-start gateway B"
)

// quickStartMounts is what each gateway's block runs in: a mount namespace
// of its own (unshare --mount) in which fresh tmpfs cover /run and
// /var/lib and the gateway's own directories ($1, $2) are bound onto
// /run/espd and /var/lib/espd, espd's default --socket directory and
// --state-dir; then the block itself ($4) with sh -e in the gateway's
// working directory ($3). The block's text is not touched: its default
// paths are the gateway's own, and the test reaches each control socket in
// the gateway's directory outside.
const quickStartMounts = `set -e
mount -t tmpfs -o mode=0755 quickstart-run /run
mkdir /run/espd
mount --bind "$1" /run/espd
mount -t tmpfs -o mode=0755 quickstart-lib /var/lib
mkdir /var/lib/espd
mount --bind "$2" /var/lib/espd
cd "$3"
exec sh -e "$4"
`

// quickStartBlock returns the text of docs/reference.md's one sh block marked
// marker.
func quickStartBlock(t *testing.T, marker string) string {
	t.Helper()
	blocks, err := docblock.Blocks("../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	m := docblock.Marked(blocks, marker)
	if len(m) != 1 || m[0].Lang != "sh" {
		t.Fatalf("docs/reference.md: want one sh block marked %q, have %+v", marker, m)
	}
	return m[0].Text
}

// TestQuickStart runs docs/reference.md's quick start as written: the keys block
// once (gateway A's working directory), its key files copied to gateway
// B's, and each gateway's block with sh -e in that gateway of a testbed
// line (client - gwA - gwB - server: the README's transit addresses and
// LANs), with the espd and espctl under test first on PATH and the default
// socket and state paths made the gateway's own (quickStartMounts). Then
// the client pings the server across, each state's packet counter on both
// gateways must have moved, and the transit link must have carried the
// LANs only as ESP. espd, which each block leaves running in the
// background, is stopped with its process group (the block's), also when
// the test fails, before the namespaces go.
func TestQuickStart(t *testing.T) {
	keys, blockA, blockB := quickStartBlock(t, quickStartKeys), quickStartBlock(t, quickStartA), quickStartBlock(t, quickStartB)
	top := testbed.NewT(t, testbed.Options{})
	env := quickStartEnv()

	work := map[string]string{"A": t.TempDir(), "B": t.TempDir()}
	scripts := t.TempDir()
	script := func(name, text string) string {
		p := filepath.Join(scripts, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	cmd := exec.CommandContext(ctx, "sh", "-e", script("keys.sh", keys))
	cmd.Dir, cmd.Env = work["A"], env
	out, err := cmd.CombinedOutput()
	cancel()
	if err != nil {
		t.Fatalf("docs/reference.md's %q block: %v\n%s", quickStartKeys, err, out)
	}
	for _, f := range []string{"ab.key", "ba.key"} {
		b, err := os.ReadFile(filepath.Join(work["A"], f))
		if err != nil {
			t.Fatalf("docs/reference.md's %q block: %v", quickStartKeys, err)
		}
		if err := os.WriteFile(filepath.Join(work["B"], f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	sockets := map[string]string{}
	for _, gw := range []struct {
		name, marker, text string
		node               *testbed.Node
	}{{"A", quickStartA, blockA, top.GwA}, {"B", quickStartB, blockB, top.GwB}} {
		run, state := t.TempDir(), t.TempDir()
		sockets[gw.name] = filepath.Join(run, "espd.sock")
		out := runGatewayBlock(t, gw.node, env, run, state, work[gw.name], script("gateway-"+gw.name+".sh", gw.text))
		t.Logf("gateway %s, docs/reference.md's %q block:\n%s", gw.name, gw.marker, out)
	}

	capt, err := top.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const pings = 5
	pctx, pcancel := context.WithTimeout(context.Background(), 30*time.Second)
	r, err := top.Client.Ping(pctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: pings})
	pcancel()
	res, cerr := capt.Stop()
	if err != nil || !r.OK() {
		t.Fatalf("ping from LAN A to LAN B after the quick start: %v\n%s", err, r.Output)
	}
	if cerr != nil {
		t.Fatal(cerr)
	}
	if leaks := res.Leaks(testbed.ClientV4.Addr(), testbed.ServerV4.Addr()); len(leaks) > 0 || !res.Complete() {
		t.Errorf("transit link: %d frames show the LANs in clear (capture complete: %v); first: %v", len(leaks), res.Complete(), leaks)
	}
	if n := res.Counts()[testbed.ClassESP]; n < 2*pings {
		t.Errorf("transit link: %d ESP frames for %d pings each way, want at least %d:\n%s", n, pings, 2*pings, res.Summary())
	}

	// Each state carried at least the pings: A -> B under 0x1001, B -> A
	// under 0x2001, counted where they were sent and where received.
	for gw, sock := range sockets {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := control.Dial(cctx, sock)
		if err != nil {
			ccancel()
			t.Fatalf("gateway %s: %v", gw, err)
		}
		sas, err := c.ListSAs(cctx)
		c.Close()
		ccancel()
		if err != nil {
			t.Fatalf("gateway %s: %v", gw, err)
		}
		got := map[uint32]uint64{}
		for _, s := range sas {
			got[s.Config.SPI] = s.Stats.Packets
		}
		for _, spi := range []uint32{0x1001, 0x2001} {
			if n, ok := got[spi]; !ok || n < pings {
				t.Errorf("gateway %s: state 0x%x carried %d packets (present: %v), want at least %d", gw, spi, n, ok, pings)
			}
		}
	}
}

// quickStartEnv is this process's environment with the directories of the
// espd and espctl under test first on PATH and no NOTIFY_SOCKET (the
// blocks' espd is no service).
func quickStartEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PATH=") && !strings.HasPrefix(kv, "NOTIFY_SOCKET=") {
			env = append(env, kv)
		}
	}
	return append(env, "PATH="+filepath.Dir(espdBin)+":"+filepath.Dir(espctlBin)+":"+os.Getenv("PATH"))
}

// runGatewayBlock runs the block in script with sh -e in node, in the
// mount namespace of quickStartMounts (run and state bound onto /run/espd
// and /var/lib/espd, work its directory), as the leader of a new process
// group, within a minute, and returns its output; it fails the test if the
// block fails. The block's background processes (espd) stay in that group,
// which t.Cleanup stops.
func runGatewayBlock(t *testing.T, node *testbed.Node, env []string, run, state, work, script string) string {
	t.Helper()
	logf, err := os.Create(script + ".log")
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", node.Name,
		"unshare", "--mount", "--propagation", "private",
		"sh", "-c", quickStartMounts, "quickstart", run, state, work, script)
	// The log is a file, not a pipe: Wait returns when the block ends,
	// although espd, left running, holds the same file.
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() {
		if err := stopGroup(pgid); err != nil {
			t.Error(err)
		}
		if b, err := os.ReadFile(script + ".log"); err == nil && t.Failed() {
			t.Logf("%s, with espd's output:\n%s", filepath.Base(script), testbed.Tail(string(b), 60))
		}
	})
	err = cmd.Wait()
	b, _ := os.ReadFile(script + ".log")
	if err != nil {
		t.Fatalf("%s in %s, as written: %v\n%s", filepath.Base(script), node.Name, err, b)
	}
	return string(b)
}

// stopGroup sends SIGTERM to the process group pgid, waits up to 10 s for
// every process of it to end, then sends SIGKILL and waits 5 s more.
func stopGroup(pgid int) error {
	for _, s := range []struct {
		sig  syscall.Signal
		wait time.Duration
	}{{syscall.SIGTERM, 10 * time.Second}, {syscall.SIGKILL, 5 * time.Second}} {
		if err := syscall.Kill(-pgid, s.sig); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		if testbed.Poll(s.wait, 50*time.Millisecond, func() bool { return !groupAlive(pgid) }) {
			return nil
		}
	}
	return errors.New("process group " + strconv.Itoa(pgid) + " still runs after SIGKILL")
}

// groupAlive reports whether a process of group pgid runs: one in /proc
// whose process group is pgid and that is not a zombie (a zombie has ended;
// its parent, init for a background process of a finished shell, reaps it).
func groupAlive(pgid int) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) >= 3 && f[2] == strconv.Itoa(pgid) && f[0] != "Z" {
			return true
		}
	}
	return false
}
