package config

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// childKeyEnv names, in the environment of the test binary run as another
// user, the key file TestKeyFileChild reads.
const childKeyEnv = "ESPD_TEST_KEY_FILE"

// TestKeyFileChild is TestKeyFileAsService's child: it reads the key file
// named in the environment and prints the outcome. Run alone, it has
// nothing to read and returns.
func TestKeyFileChild(t *testing.T) {
	p := os.Getenv(childKeyEnv)
	if p == "" {
		return
	}
	k, err := ReadKeyFile("enc_key_file", p, 20)
	clear(k)
	if err != nil {
		fmt.Printf("RESULT refused: %v\n", err)
		return
	}
	fmt.Printf("RESULT read\n")
}

// TestKeyFileAsService reads key files as a service user does (uid and
// gid 65534, as User= and Group= of a unit): its own file and a file of
// root's in its group are read; a file of root's it may not read is
// refused naming owner, group and mode, and the fix; a file of another
// user's in its group is refused naming that owner.
func TestKeyFileAsService(t *testing.T) {
	needRoot(t)
	const id = 65534
	dir, err := os.MkdirTemp("", "espd-keyfile-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "config.test")
	copyFile(t, bin)
	good := gcmKeyHex + "\n"
	for _, c := range []struct {
		name     string
		mode     os.FileMode
		uid, gid int
		want     string
	}{
		{"own", 0o600, id, id, "read"},
		{"root-group", 0o640, 0, id, "read"},
		{"root-only", 0o600, 0, 0, fmt.Sprintf("refused: enc_key_file %s: permission denied: owner %s, group %s, mode 0600, and the reader runs as %s: chown root:%s %s; chmod 0640 %s",
			filepath.Join(dir, "root-only"), who(0), group(0), who(id), groupName(id), filepath.Join(dir, "root-only"), filepath.Join(dir, "root-only"))},
		{"other-owner", 0o640, 12345, id, fmt.Sprintf("refused: enc_key_file %s: key file belongs to another user: owner uid 12345, group %s, mode 0640; "+
			"a key file must be owned by root or %s, the user reading it: chown root:%s", filepath.Join(dir, "other-owner"), group(id), who(id), groupName(id))},
	} {
		p := filepath.Join(dir, c.name)
		writeKey(t, p, good, c.mode)
		if err := os.Chown(p, c.uid, c.gid); err != nil {
			t.Fatal(err)
		}
		got := readAs(t, bin, p, id)
		if !strings.HasPrefix(got, c.want) {
			t.Errorf("%s: the service user got\n%s\nwant\n%s", c.name, got, c.want)
		}
	}
}

// copyFile copies the running test binary to dst, executable by all.
func copyFile(t *testing.T, dst string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
