package gwpair

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/internal/docblock"
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
	b.p.ApplyRoleFile(ctx, link, 0)
	if r := b.node.Role(); r != pairsync.RoleStandby {
		t.Errorf("role file behind a symbolic link: role %v, want standby", r)
	}
	a.p.ApplyRoleFile(ctx, rolePath, 0)
	if r := a.node.Role(); r != pairsync.RoleActive {
		t.Errorf("role file says active: role %v", r)
	}
}

// TestNotifyScriptRoleFile runs docs/ha.md's notify script as written
// (without keepalived or charon: the events from a file, espctl replaced
// by true) and checks its file handling: it makes the role's directory
// (root's, 0755), replaces a symbolic link planted at the role file's
// name instead of writing through it, leaves the role that readRoleFile
// reads, and no temporary file behind.
func TestNotifyScriptRoleFile(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the notify script runs as root")
		}
		t.Skip("not root")
	}
	script, err := docblock.One("../docs/ha.md", "sh", "ha notify")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	doc := filepath.Join(dir, "espd-pair-notify")
	if err := os.WriteFile(doc, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	roleDir := filepath.Join(dir, "espd-pair")
	role := filepath.Join(roleDir, "role")
	run := func(events ...string) {
		t.Helper()
		ev := filepath.Join(dir, "events")
		if err := os.WriteFile(ev, []byte(strings.Join(events, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "sh", doc, "GROUP", "pair", "MASTER", ev)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "CHARON_PID=none", "ESPCTL=true",
			"ESPD_PAIR_LOG=" + filepath.Join(dir, "notify.log"), "ESPD_PAIR_ROLE_FILE=" + role}
		if out, err := cmd.CombinedOutput(); err != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "notify.log"))
			t.Fatalf("the notify script: %v\n%s\n%s", err, out, log)
		}
	}
	check := func(want string) {
		t.Helper()
		b, err := readRoleFile(role)
		if err != nil || string(b) != want+"\n" {
			t.Fatalf("role file: %q, %v; want %s", b, err, want)
		}
		di, err := os.Lstat(roleDir)
		if err != nil || di.Mode() != os.ModeDir|0o755 {
			t.Fatalf("the role's directory: %v, %v; want a directory, mode 0755", di.Mode(), err)
		}
		if ents, _ := os.ReadDir(roleDir); len(ents) != 1 {
			t.Errorf("the role's directory holds %d entries, want the role file alone", len(ents))
		}
	}
	run(`GROUP "pair" MASTER 150`)
	check("active")
	run(`GROUP "pair" MASTER 150`, `INSTANCE "wan" BACKUP 100`, `GROUP "pair" BACKUP 100`)
	check("standby")

	// A link planted where the role file goes is replaced, not followed.
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(role)
	if err := os.Symlink(victim, role); err != nil {
		t.Fatal(err)
	}
	run(`GROUP "pair" MASTER 150`)
	check("active")
	if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
		t.Errorf("the script wrote through a planted link: the target holds %q", b)
	}
}
