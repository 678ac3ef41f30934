package config

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/internal/docblock"
)

// TestKeyRecipe runs docs/config.md's key file commands as written, in a
// directory of their own instead of /etc/espd and with uid 65534's group
// in place of espd's (the test machine has no espd user), and checks what
// issue 38 asks: the files are root:espd 0640 in a root:espd 0750
// directory, hold 20 random bytes that espd takes, and are read by the
// service's user and by nobody else (uid 12345 is refused); no command
// needs xxd, which minimal Debian lacks.
func TestKeyRecipe(t *testing.T) {
	needRoot(t)
	const svc, other = 65534, 12345
	block, err := docblock.One("../docs/config.md", "sh", "config key files")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(block, "xxd") || !strings.Contains(block, "-g espd") || !strings.Contains(block, "/etc/espd/keys/ab.key") {
		t.Fatalf("docs/config.md's key commands use xxd, or not espd's group and /etc/espd/keys:\n%s", block)
	}
	dir, err := os.MkdirTemp("", "espd-keyrecipe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := strings.NewReplacer("/etc/espd/", dir+"/", "-g espd", "-g 65534").Replace(block)
	cmd := exec.Command("sh", "-ec", script)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docs/config.md's key commands: %v\n%s", err, out)
	}
	keys := filepath.Join(dir, "keys")
	checkOwner(t, keys, 0o750|os.ModeDir, 0, svc)
	bin := filepath.Join(dir, "config.test")
	copyFile(t, bin)
	seen := map[string]bool{}
	for _, name := range []string{"ab.key", "ba.key"} {
		p := filepath.Join(keys, name)
		checkOwner(t, p, 0o640, 0, svc)
		k, err := ReadKeyFile("enc_key_file", p, 20)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		seen[string(k)] = true
		clear(k)
		if got := readAs(t, bin, p, svc); got != "read" {
			t.Errorf("%s, read by the service's user: %s", name, got)
		}
		if got := readAs(t, bin, p, other); !strings.Contains(got, "permission denied") {
			t.Errorf("%s, read by uid %d: %s", name, other, got)
		}
	}
	if len(seen) != 2 {
		t.Error("the two key files hold the same key")
	}
}

// checkOwner fails t unless path has this mode, owner and group.
func checkOwner(t *testing.T, path string, mode os.FileMode, uid, gid uint32) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode() != mode || st.Uid != uid || st.Gid != gid {
		t.Errorf("%s: %v %d:%d, want %v %d:%d", path, fi.Mode(), st.Uid, st.Gid, mode, uid, gid)
	}
}

// readAs runs TestKeyFileChild as uid:gid id on the key file at p, and
// returns what it says: "read" or "refused: ...".
func readAs(t *testing.T, bin, p string, id uint32) string {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^TestKeyFileChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childKeyEnv+"="+p)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: id, Gid: id, Groups: []uint32{}}}
	cmd.WaitDelay = 30 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the child as uid %d: %v\n%s", id, err, out)
	}
	_, got, ok := strings.Cut(string(out), "RESULT ")
	if !ok {
		t.Fatalf("the child as uid %d said nothing:\n%s", id, out)
	}
	got, _, _ = strings.Cut(got, "\n")
	return got
}
