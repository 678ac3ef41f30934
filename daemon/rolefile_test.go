package daemon

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/pairsync"
)

// TestReadRoleFile: the role file is read only if it is a regular file of
// root's (or espd's user's) that no one else may write, reached without a
// symbolic link; a FIFO does not block the reader; a missing file is
// fs.ErrNotExist (the node stands by).
func TestReadRoleFile(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test changes file owners: run it as root")
		}
		t.Skip("not root")
	}
	file := func(text string, mode os.FileMode, uid int) func(string) error {
		return func(p string) error {
			if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
				return err
			}
			if err := os.Chown(p, uid, 0); err != nil {
				return err
			}
			return os.Chmod(p, mode)
		}
	}
	for _, c := range []struct {
		name string
		make func(p string) error
		want string // the content, or what the error says
		ok   bool
	}{
		{"root 0644", file("active\n", 0o644, 0), "active\n", true},
		{"root 0600", file("standby\n", 0o600, 0), "standby\n", true},
		{"symlink", func(p string) error {
			if err := file("active\n", 0o644, 0)(p + ".rolePath"); err != nil {
				return err
			}
			return os.Symlink(p+".rolePath", p)
		}, "is a symbolic link", false},
		{"fifo", func(p string) error { return unix.Mkfifo(p, 0o644) }, "not a regular file", false},
		{"directory", func(p string) error { return os.Mkdir(p, 0o755) }, "not a regular file", false},
		{"group-writable", file("active\n", 0o664, 0), "mode 0664 lets others write it", false},
		{"world-writable", file("active\n", 0o646, 0), "mode 0646", false},
		{"other owner", file("active\n", 0o644, 12345), "owned by uid 12345", false},
		{"big", file(strings.Repeat("active\n", 20), 0o644, 0), "not a role file", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "role")
			if err := c.make(p); err != nil {
				t.Fatal(err)
			}
			type result struct {
				b   []byte
				err error
			}
			done := make(chan result, 1)
			go func() {
				b, err := readRoleFile(p)
				done <- result{b, err}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("readRoleFile blocks")
			}
			if c.ok && (r.err != nil || string(r.b) != c.want) {
				t.Fatalf("%q, %v; want %q", r.b, r.err, c.want)
			}
			if !c.ok && (r.err == nil || !strings.Contains(r.err.Error(), c.want) || !strings.Contains(r.err.Error(), p)) {
				t.Fatalf("%q, %v; want an error naming %s and saying %q", r.b, r.err, p, c.want)
			}
		})
	}
	if _, err := readRoleFile(filepath.Join(t.TempDir(), "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing role file: %v", err)
	}
}

// TestApplyRoleFile: a node whose role file says active takes the role at
// start; one whose role file is a symbolic link to such a file stands by.
func TestApplyRoleFile(t *testing.T) {
	a, b, start := newPairNodes(t)
	start()
	dir := t.TempDir()
	rolePath := filepath.Join(dir, "role")
	if err := os.WriteFile(rolePath, []byte("active\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(rolePath, link); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.d.opts.Pair.RoleFile = link
	b.d.applyRoleFile(ctx)
	if r := b.node.Role(); r != pairsync.RoleStandby {
		t.Errorf("role file behind a symbolic link: role %v, want standby", r)
	}
	a.d.opts.Pair.RoleFile = rolePath
	a.d.applyRoleFile(ctx)
	if r := a.node.Role(); r != pairsync.RoleActive {
		t.Errorf("role file says active: role %v", r)
	}
}
