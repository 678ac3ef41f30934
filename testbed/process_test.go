package testbed

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestProcessExitKeepsPID: a process that has exited keeps its PID (and so
// its process group's ID) until Stop, which kills what it left in its
// group and only then reaps it. A group kill after the reap could reach an
// unrelated process that was given the number since.
func TestProcessExitKeepsPID(t *testing.T) {
	n := processNode(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	// The leader exits 3 and leaves a sleep behind in its group.
	p, err := n.Start(filepath.Join(dir, "log"), "sh", "-c", "sleep 600 & echo $! > "+pidFile+"; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("sh did not exit within 30 s")
	}
	if code, ok := p.ExitCode(); !ok || code != 3 {
		t.Errorf("ExitCode() = %d, %v; want 3, true", code, ok)
	}
	if done, err := p.Exited(); !done || err == nil || err.Error() != "exit status 3" {
		t.Errorf("Exited() = %v, %v; want true, exit status 3", done, err)
	}
	// Unreaped: the leader is a zombie that still holds its PID.
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid()) + "/stat")
	if err != nil || !strings.Contains(string(stat), ") Z ") {
		t.Errorf("/proc/%d/stat after the exit: %q, %v; want a zombie", p.Pid(), stat, err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if child <= 0 || syscall.Kill(child, 0) != nil {
		t.Fatalf("the leftover sleep (%q) is not running", b)
	}
	if err := p.Stop(time.Second); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("Stop() = %v, want the exit status reported", err)
	}
	if !Poll(10*time.Second, 20*time.Millisecond, func() bool {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(child) + "/stat")
		return err != nil || strings.Contains(string(stat), ") Z ")
	}) {
		t.Errorf("the leftover sleep %d survived Stop", child)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(p.Pid())); err == nil {
		if stat, _ := os.ReadFile("/proc/" + strconv.Itoa(p.Pid()) + "/stat"); strings.Contains(string(stat), ") Z ") {
			t.Errorf("the leader %d is still unreaped after Stop", p.Pid())
		}
	}
}

// TestProcessSignalExit: a signal's end is reported as exec.ExitError would.
func TestProcessSignalExit(t *testing.T) {
	n := processNode(t)
	p, err := n.Start(filepath.Join(t.TempDir(), "log"), "sleep", "600")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("sleep did not end within 30 s of SIGKILL")
	}
	if code, _ := p.ExitCode(); code != -1 {
		t.Errorf("ExitCode() = %d, want -1", code)
	}
	if _, err := p.Exited(); err == nil || err.Error() != "signal: killed" {
		t.Errorf("Exited() error = %v, want signal: killed", err)
	}
	if err := p.Stop(time.Second); err == nil {
		t.Errorf("Stop() after SIGKILL = nil, want the signal reported")
	}
}

// processNode is a namespace of its own for a process test, removed
// (its processes stopped) when the test ends.
func processNode(t *testing.T) *Node {
	t.Helper()
	if err := Available(); err != nil {
		t.Skip(err)
	}
	n, err := NewNode("etbproc", "host")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Remove() })
	return n
}
