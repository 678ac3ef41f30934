package gwpair

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/config"
)

// TestPairKeyFile: the pair key is read as every key file is
// (config.OpenKeyFile): a symbolic link, a FIFO, a directory, a file of
// another owner, or one others may read is refused with a
// message naming what is wrong and the fix; so are an all-zero key and
// one of another length. A root-owned 0640 file of 32 bytes is read,
// whatever its group (espd's, under the packaged units).
func TestPairKeyFile(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test changes file owners: run it as root")
		}
		t.Skip("not root")
	}
	good := "0x" + strings.Repeat("0123456789abcdef", 4) + "\n"
	file := func(text string, mode os.FileMode, uid, gid int) func(string) error {
		return func(p string) error {
			if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
				return err
			}
			if err := os.Chown(p, uid, gid); err != nil {
				return err
			}
			return os.Chmod(p, mode)
		}
	}
	for _, c := range []struct {
		name string
		make func(p string) error
		err  error
		says string
	}{
		{"symlink", func(p string) error {
			if err := file(good, 0o600, 0, 0)(p + ".real"); err != nil {
				return err
			}
			return os.Symlink(p+".real", p)
		}, config.ErrKeyFileType, "symbolic link"},
		{"fifo", func(p string) error { return unix.Mkfifo(p, 0o600) }, config.ErrKeyFileType, "a FIFO"},
		{"directory", func(p string) error { return os.Mkdir(p, 0o700) }, config.ErrKeyFileType, "a directory"},
		{"other owner", file(good, 0o640, 12345, 0), config.ErrKeyFileOwner, "owner uid 12345, group root (gid 0), mode 0640"},
		{"world-readable", file(good, 0o644, 0, 0), config.ErrKeyFileMode, "mode 0644"},
		{"zeros", file(strings.Repeat("00", 32), 0o640, 0, 0), nil, "all zeros"},
		{"short", file(good[:64], 0o640, 0, 0), nil, "31 bytes, want 32 (64 hex digits"},
		{"long", file(good+"00", 0o640, 0, 0), nil, "33 bytes, want 32"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "pair.key")
			if err := c.make(p); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := readPairKey(p)
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("readPairKey blocks")
			}
			if err == nil || (c.err != nil && !errors.Is(err, c.err)) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), p) {
				t.Fatalf("%v, want %v saying %q and naming %s", err, c.err, c.says, p)
			}
			if strings.Contains(err.Error(), "0123456789abcdef") {
				t.Errorf("the error shows the key: %v", err)
			}
		})
	}
	p := filepath.Join(t.TempDir(), "pair.key")
	if err := file(good, 0o640, 0, 12345)(p); err != nil {
		t.Fatal(err)
	}
	k, err := readPairKey(p)
	if err != nil || k[0] != 0x01 || k[31] != 0xef {
		t.Fatalf("root:12345 0640: %x, %v", k, err)
	}
}
