package testbed

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSignalHelper is not a test of its own: TestHandleSignals runs the test
// binary with ETB_SIGNAL_HELPER set, and this function then plays a harness
// that builds a topology, starts a process in it and waits to be
// interrupted.
func TestSignalHelper(t *testing.T) {
	if os.Getenv("ETB_SIGNAL_HELPER") == "" {
		return
	}
	HandleSignals(nil)
	top, err := New(Options{Prefix: "etbsig"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := top.GwA.Start(filepath.Join(os.Getenv("ETB_SIGNAL_HELPER"), "sleep.log"), "sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range top.Nodes() {
		names = append(names, n.Name)
	}
	os.Stdout.WriteString("READY " + strconv.Itoa(p.Pid()) + " " + strings.Join(names, " ") + "\n")
	time.Sleep(30 * time.Second)
	t.Fatal("not interrupted")
}

// TestHandleSignals interrupts a harness (the helper above) with SIGINT and
// checks that it removed its namespaces and stopped its process on the way
// out.
func TestHandleSignals(t *testing.T) {
	skipUnlessAvailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSignalHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), "ETB_SIGNAL_HELPER="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var fields []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 6 && f[0] == "READY" {
			fields = f[1:]
			break
		}
	}
	if fields == nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("the helper never got ready")
	}
	// Whatever happens, do not leave the helper's namespaces behind.
	t.Cleanup(func() {
		for _, name := range fields[1:] {
			deleteNamespace(name)
		}
	})
	go func() {
		for sc.Scan() {
		}
	}()
	t.Logf("helper ready: pid %s, namespaces %v", fields[0], fields[1:])
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Errorf("helper exited with %v, want status 130", err)
	}
	for _, name := range fields[1:] {
		if nsExists(name) {
			t.Errorf("namespace %s left behind", name)
		}
	}
	// The process is gone, or a zombie nobody reaped yet.
	pid, _ := strconv.Atoi(fields[0])
	if st, err := os.ReadFile("/proc/" + fields[0] + "/stat"); err == nil {
		if i := strings.LastIndexByte(string(st), ')'); i < 0 || i+2 >= len(st) || st[i+2] != 'Z' {
			t.Errorf("process %d still running: %s", pid, st)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
