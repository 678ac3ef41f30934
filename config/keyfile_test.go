package config

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needRoot skips a test that changes a file's owner when not root, and
// fails it in CI, which runs as root.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test changes file owners: run it as root")
		}
		t.Skip("not root")
	}
}

// keyFileRefusal is one key file OpenKeyFile refuses.
type keyFileRefusal struct {
	name string
	make func(t *testing.T, path string) // makes the file at path
	err  error                           // wrapped by the error
	says []string                        // and said in it
}

// keyFileRefusals are the files every key file reader must refuse
// (ReadKeyFile's callers run them through their own paths too).
func keyFileRefusals(good string) []keyFileRefusal {
	write := func(mode os.FileMode, uid, gid int) func(*testing.T, string) {
		return func(t *testing.T, p string) {
			writeKey(t, p, good, mode)
			if err := os.Chown(p, uid, gid); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, mode); err != nil { // chown clears nothing here, but be exact
				t.Fatal(err)
			}
		}
	}
	return []keyFileRefusal{
		{"symlink", func(t *testing.T, p string) {
			write(0o600, 0, 0)(t, p+".target")
			if err := os.Symlink(filepath.Base(p)+".target", p); err != nil {
				t.Fatal(err)
			}
		}, ErrKeyFileType, []string{"symbolic link", "name the key file itself"}},
		{"fifo", func(t *testing.T, p string) {
			if err := unix.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}, ErrKeyFileType, []string{"a FIFO"}},
		{"directory", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}, ErrKeyFileType, []string{"a directory"}},
		{"world-readable", write(0o644, 0, 0), ErrKeyFileMode, []string{"mode 0644", "chmod o-rw"}},
		{"world-writable", write(0o602, 0, 0), ErrKeyFileMode, []string{"mode 0602"}},
		{"other owner", write(0o640, 12345, 0), ErrKeyFileOwner,
			[]string{"owner uid 12345, group root (gid 0), mode 0640", "chown root:", "; chmod 0640 "}},
		{"other owner 0600", write(0o600, 12345, 12345), ErrKeyFileOwner, []string{"owner uid 12345", "mode 0600"}},
	}
}

// checkRefusal runs one refusal through read, which reads the key file at
// path, and checks the error.
func checkRefusal(t *testing.T, c keyFileRefusal, read func(path string) error) {
	t.Helper()
	needRoot(t)
	p := filepath.Join(t.TempDir(), "k")
	c.make(t, p)
	done := make(chan error, 1)
	go func() { done <- read(p) }() // a FIFO must not block the reader
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the reader blocks", c.name)
	}
	if !errors.Is(err, c.err) || !strings.Contains(err.Error(), p) {
		t.Fatalf("%s: %v, want %v naming %s", c.name, err, c.err, p)
	}
	for _, s := range c.says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: %q does not say %q", c.name, err, s)
		}
	}
	if strings.Contains(err.Error(), "0405060708090a0b") {
		t.Errorf("%s: the error shows the key: %v", c.name, err)
	}
}

// TestOpenKeyFile: one rule for every key file, checked on the open file.
func TestOpenKeyFile(t *testing.T) {
	good := "0x" + gcmKeyHex + "\n"
	for _, c := range keyFileRefusals(good) {
		t.Run(c.name, func(t *testing.T) {
			checkRefusal(t, c, func(p string) error {
				k, err := ReadKeyFile("enc_key_file", p, 20)
				if err == nil {
					clear(k)
				}
				return err
			})
		})
	}
	// Accepted: root's or the reader's, in any group.
	needRoot(t)
	for _, c := range []struct {
		mode     os.FileMode
		uid, gid int
	}{{0o640, 0, 0}, {0o640, 0, 12345}, {0o400, 0, 0}, {0o660, os.Geteuid(), os.Getegid()}, {0o660, os.Geteuid(), 12345}} {
		p := filepath.Join(t.TempDir(), "k")
		writeKey(t, p, good, c.mode)
		if err := os.Chown(p, c.uid, c.gid); err != nil {
			t.Fatal(err)
		}
		if k, err := ReadKeyFile("enc_key_file", p, 20); err != nil || len(k) != 20 || k[19] != 0x13 {
			t.Errorf("%04o %d:%d: %x, %v", c.mode, c.uid, c.gid, k, err)
		}
	}
}

// TestKeyFileContent: an all-zero key and a short one are refused, without
// a digit of either in the error.
func TestKeyFileContent(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ name, text, says string }{
		{"zeros", strings.Repeat("00", 20), "all zeros"},
		{"zeros 0x", "0x" + strings.Repeat("0000 ", 10) + "\n", "all zeros"},
		{"short", gcmKeyHex[:38], "19 bytes; the suite needs 20"},
	} {
		p := filepath.Join(dir, c.name)
		writeKey(t, p, c.text, 0o640)
		_, err := ReadKeyFile("enc_key_file", p, 20)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want %q", c.name, err, c.says)
		}
		if err != nil && (strings.Contains(err.Error(), strings.Repeat("0", 16)) || strings.Contains(err.Error(), "0102030405")) {
			t.Errorf("%s: the error shows the key: %v", c.name, err)
		}
	}
	// Any length (espctl's keys, checked against the suite later): zeros
	// are still refused.
	if _, err := ParseKeyBytes("k", []byte("000000"), -1); err == nil || !strings.Contains(err.Error(), "all zeros") {
		t.Errorf("zero key of any length: %v", err)
	}
}

// TestKeyFileUnreadable: a file the reader may not open is explained by
// its owner, group and mode and the fix, not by "permission denied" alone.
func TestKeyFileUnreadable(t *testing.T) {
	p := filepath.Join(t.TempDir(), "k")
	writeKey(t, p, gcmKeyHex, 0o600)
	defer func(l func(string) (*user.Group, error)) { lookupGroup = l }(lookupGroup)
	// Whether the machine has a group espd (the packages leave it behind)
	// decides the fix root is told: group espd if it exists, else its own.
	for _, espd := range []bool{false, true} {
		lookupGroup = func(name string) (*user.Group, error) {
			if espd && name == "espd" {
				return &user.Group{Gid: "998", Name: "espd"}, nil
			}
			return nil, user.UnknownGroupError(name)
		}
		fixGroup := groupName(os.Getegid())
		if espd && os.Getegid() == 0 {
			fixGroup = "espd"
		}
		err := openError("pair key", p, syscall.EACCES)
		want := fmt.Sprintf("pair key %s: permission denied: owner %s, group %s, mode 0600, and the reader runs as %s: chown root:%s %s; chmod 0640 %s",
			p, who(os.Geteuid()), group(os.Getegid()), who(os.Geteuid()), fixGroup, p, p)
		if err.Error() != want {
			t.Errorf("unreadable file, group espd exists %v:\n got %v\nwant %s", espd, err, want)
		}
	}
	gone := filepath.Join(p+".dir", "k")
	if err := openError("pair key", gone, syscall.EACCES); !strings.Contains(err.Error(), "install -d -m 0750 -o root -g ") {
		t.Errorf("unreachable file: %v", err)
	}
	if err := openError("pair key", p, syscall.ENOENT); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), p) {
		t.Errorf("missing file: %v", err)
	}
}

// TestConfigKeyFileRule: a configuration file's enc_key_file is held to
// the same rule, and the refusal names the SA's line.
func TestConfigKeyFileRule(t *testing.T) {
	for _, c := range keyFileRefusals("0x" + gcmKeyHex + "\n") {
		t.Run(c.name, func(t *testing.T) {
			checkRefusal(t, c, func(p string) error {
				text := "\n[[sa]]\nspi = 0x2001\ndir = \"in\"\nsrc = \"198.18.0.2\"\ndst = \"198.18.0.1\"\nsuite = \"aes128gcm16\"\nenc_key_file = \"" + p + "\"\n"
				f, err := Parse(filepath.Join(t.TempDir(), "gw.toml"), []byte(text))
				if err == nil {
					f.Wipe()
					return nil
				}
				var ce *Error
				if !errors.As(err, &ce) || ce.Line != 2 {
					t.Errorf("%v: not an error of line 2", err)
				}
				return err
			})
		})
	}
	// Zeros, inline or in a key file, and a short key file.
	dir := t.TempDir()
	writeKey(t, filepath.Join(dir, "zero.key"), strings.Repeat("00", 20), 0o640)
	writeKey(t, filepath.Join(dir, "short.key"), gcmKeyHex[:38], 0o640)
	for key, says := range map[string]string{
		`enc_key = "` + strings.Repeat("00", 20) + `"`: "sa #1: enc_key is all zeros",
		`enc_key_file = "zero.key"`:                    "zero.key is all zeros",
		`enc_key_file = "short.key"`:                   "short.key is 19 bytes; the suite needs 20",
	} {
		text := "[[sa]]\nspi = 0x2001\ndir = \"in\"\nsrc = \"198.18.0.2\"\ndst = \"198.18.0.1\"\nsuite = \"aes128gcm16\"\n" + key + "\n"
		if _, err := Parse(filepath.Join(dir, "gw.toml"), []byte(text)); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want %q", key, err, says)
		}
	}
}
