package main

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

// TestKeyFileRule: espctl reads --enc-key-file and --integ-key-file as
// espd reads every key file (config.OpenKeyFile): a symbolic link, a
// FIFO, a directory, a file of another owner or one others may read is
// refused, naming the file, what is wrong and the fix; a key of
// zeros only is refused from a file and from standard input; a root-owned
// 0640 file is read, whatever its group.
func TestKeyFileRule(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test changes file owners: run it as root")
		}
		t.Skip("not root")
	}
	add := []string{"--spi", "0x1000", "--src", "198.18.0.1", "--dst", "198.18.0.2", "--dir", "out", "--enc", "aes128gcm16", "--enc-key-file"}
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
			if err := file(gcmKey, 0o600, 0, 0)(p + ".real"); err != nil {
				return err
			}
			return os.Symlink(p+".real", p)
		}, config.ErrKeyFileType, "symbolic link"},
		{"fifo", func(p string) error { return unix.Mkfifo(p, 0o600) }, config.ErrKeyFileType, "a FIFO"},
		{"directory", func(p string) error { return os.Mkdir(p, 0o700) }, config.ErrKeyFileType, "a directory"},
		{"other owner", file(gcmKey, 0o600, 12345, 0), config.ErrKeyFileOwner, "owner uid 12345, group root (gid 0), mode 0600"},
		{"world-readable", file(gcmKey, 0o604, 0, 0), config.ErrKeyFileMode, "mode 0604"},
		{"zeros", file(strings.Repeat("00", 20), 0o640, 0, 0), nil, "is all zeros"},
		{"short", file(gcmKey[:40], 0o640, 0, 0), nil, "got 19"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "k")
			if err := c.make(p); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, _, err := parseSA(t, "sa add", true, []string{"config"}, append(add, p)...)
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("espctl blocks on the key file")
			}
			name := "--enc-key-file " + p
			if c.name == "short" { // checked against the suite, after the file is read
				name = "--enc-key-file: aes128gcm16 takes 20 bytes"
			}
			if err == nil || (c.err != nil && !errors.Is(err, c.err)) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), name) {
				t.Fatalf("%v, want %v saying %q and %q", err, c.err, c.says, name)
			}
			if strings.Contains(err.Error(), "0405060708090a0b") || strings.Contains(err.Error(), strings.Repeat("0", 16)) {
				t.Errorf("the error shows the key: %v", err)
			}
		})
	}
	if _, _, err := parseSAStdin(t, "sa add", true, []string{"config"}, strings.Repeat("00", 20)+"\n", append(add, "-")...); err == nil || !strings.Contains(err.Error(), "is all zeros") {
		t.Errorf("zeros on standard input: %v", err)
	}
	p := filepath.Join(t.TempDir(), "k")
	if err := file(gcmKey, 0o640, 0, 12345)(p); err != nil {
		t.Fatal(err)
	}
	c, _, err := parseSA(t, "sa add", true, []string{"config"}, append(add, p)...)
	if err != nil || len(c.EncKey) != 20 || c.EncKey[19] != 0x13 {
		t.Fatalf("root-owned 0640 key file: %v", err)
	}
}
