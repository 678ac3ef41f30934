package testbed

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type runFunc func() int

func (f runFunc) Run() int { return f() }

// TestEspdMain checks that EspdMain builds both binaries into a directory
// others can search, hands on the tests' exit code and removes the
// directory afterwards.
func TestEspdMain(t *testing.T) {
	if testing.Short() {
		t.Skip("builds espd and espctl")
	}
	var espd, espctl string
	ran := false
	code := EspdMain(runFunc(func() int {
		ran = true
		for _, bin := range []string{espd, espctl} {
			fi, err := os.Stat(bin)
			if err != nil {
				t.Error(err)
			} else if fi.Mode()&0o111 == 0 {
				t.Errorf("%s is not executable: %v", bin, fi.Mode())
			}
		}
		if filepath.Dir(espd) != filepath.Dir(espctl) {
			t.Errorf("espd %s and espctl %s in different directories", espd, espctl)
		}
		if fi, err := os.Stat(filepath.Dir(espd)); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("binary directory: %v %v, want mode 0755", fi.Mode(), err)
		}
		return 7
	}), "testbed", &espd, &espctl)
	if !ran || code != 7 {
		t.Errorf("ran %v, code %d; want the tests run and their code 7", ran, code)
	}
	if _, err := os.Stat(filepath.Dir(espd)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("binary directory left behind: %v", err)
	}
}

// TestWaitEspd checks the three outcomes of WaitEspd with a stand-in for
// espd: it exits, it never gets ready, it gets ready once both its socket
// answers and its TUN exists.
func TestWaitEspd(t *testing.T) {
	skipUnlessAvailable(t)
	top := NewT(t, Options{Prefix: "etbtest"})
	dir := t.TempDir()
	sock := filepath.Join(dir, "espd.sock")
	const tun = "etbtun0"
	wait := func(p *Process, d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return WaitEspd(ctx, top.GwA, p, sock, tun)
	}

	exiting, err := top.GwA.Start(filepath.Join(dir, "exit.log"), "sh", "-c", "exit 3")
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(exiting, 10*time.Second); err == nil || !strings.Contains(err.Error(), "exited during start") {
		t.Errorf("process that exits: %v", err)
	}
	_ = exiting.Stop(0) // its exit status is the point, not a failure of Close

	p, err := top.GwA.Start(filepath.Join(dir, "sleep.log"), "sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(p, 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("neither socket nor TUN: %v", err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if err := wait(p, 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("socket but no TUN: %v", err)
	}
	if _, err := top.GwA.IP(context.Background(), "tuntap", "add", "dev", tun, "mode", "tun"); err != nil {
		t.Fatal(err)
	}
	if err := wait(p, 10*time.Second); err != nil {
		t.Errorf("socket and TUN: %v", err)
	}
}

// TestEspctl runs a stand-in for espctl that echoes its arguments.
func TestEspctl(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "espctl")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho \"$X\" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := Espctl(nil, bin, "/s", "sa", "list")
	if err != nil || out != " -s /s sa list\n" {
		t.Errorf("Espctl: %q, %v", out, err)
	}
	out, err = Espctl([]string{"env", "X=pre"}, bin, "/s", "x")
	if err != nil || out != "pre -s /s x\n" {
		t.Errorf("Espctl with a prefix: %q, %v", out, err)
	}
}
