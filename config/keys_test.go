package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/espd/espd/sa"
)

const (
	gcmKeyHex = "000102030405060708090a0b0c0d0e0f10111213"
	shaKeyHex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
)

func TestParseKeyBytes(t *testing.T) {
	want, _ := ParseKey("k", gcmKeyHex, 20)
	for _, in := range []string{
		gcmKeyHex,
		"0x" + gcmKeyHex + "\n",
		"  0X" + strings.ToUpper(gcmKeyHex) + "\r\n\n",
		"00010203 04050607\t08090a0b\n0c0d0e0f\n10111213\n", // xxd -p style line breaks
		"00:01:02:03:04:05:06:07:08:09:0a:0b:0c:0d:0e:0f:10:11:12:13",
	} {
		src := []byte(in)
		k, err := ParseKeyBytes("k", src, 20)
		if err != nil || !bytes.Equal(k, want) {
			t.Errorf("%q: %x, %v", in, k, err)
		}
		if string(src) != in {
			t.Errorf("%q: input changed", in)
		}
	}
	for in, reason := range map[string]string{
		"":                          "required",
		"  \n":                      "required",
		gcmKeyHex[:39]:              "odd number of hex digits",
		gcmKeyHex[:38] + "zz":       "not valid hex",
		gcmKeyHex + "00":            "21 bytes; the suite needs 20",
		"0x 0x" + gcmKeyHex[:36]:    "not valid hex",
		"-----BEGIN KEY-----\n0001": "not valid hex",
	} {
		_, err := ParseKeyBytes("k", []byte(in), 20)
		if err == nil || !strings.Contains(err.Error(), reason) {
			t.Errorf("%q: %v, want %q", in, err, reason)
		}
		if err != nil && strings.Contains(err.Error(), "0203") {
			t.Errorf("%q: error %q quotes the key", in, err)
		}
	}
	if _, err := ParseKeyBytes("k", []byte("00"), 0); err == nil || !strings.Contains(err.Error(), "takes none") {
		t.Errorf("key for a suite without one: %v", err)
	}
	if k, err := ParseKeyBytes("k", []byte("\n"), 0); err != nil || k != nil {
		t.Errorf("no key for a suite without one: %x, %v", k, err)
	}
}

// writeKey writes a key file with this mode (umask aside).
func writeKey(t *testing.T, path, text string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "k")
	for _, mode := range []os.FileMode{0o600, 0o400, 0o640, 0o660} {
		writeKey(t, p, "0x"+gcmKeyHex+"\n", mode)
		if k, err := ReadKeyFile("enc_key_file", p, 20); err != nil || len(k) != 20 || k[19] != 0x13 {
			t.Errorf("mode %04o: %x, %v", mode, k, err)
		}
	}
	for _, mode := range []os.FileMode{0o644, 0o604, 0o602, 0o666} {
		writeKey(t, p, gcmKeyHex, mode)
		_, err := ReadKeyFile("enc_key_file", p, 20)
		if !errors.Is(err, ErrKeyFileMode) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "chmod o-rw") {
			t.Errorf("mode %04o: %v, want a refusal", mode, err)
		}
	}
	big := filepath.Join(dir, "big")
	writeKey(t, big, strings.Repeat("00", MaxKeyFile), 0o600)
	if _, err := ReadKeyFile("enc_key_file", big, 20); err == nil || !strings.Contains(err.Error(), "not a key file") {
		t.Errorf("huge file: %v", err)
	}
	if _, err := ReadKeyFile("enc_key_file", dir, 20); err == nil {
		t.Error("a directory read as a key file")
	}
}

// TestConfigKeyFiles installs keys from files named relative to the
// configuration file's directory and absolutely, and refuses files others
// can read.
func TestConfigKeyFiles(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "keys"), 0o700)
	writeKey(t, filepath.Join(dir, "keys", "enc"), "\n  0x"+strings.ToUpper(shaKeyHex)+"  \n", 0o600)
	integ := filepath.Join(t.TempDir(), "integ.key")
	writeKey(t, integ, shaKeyHex[:32]+"\n"+shaKeyHex[32:]+"\n", 0o400)
	text := `
[[sa]]
spi = 0x2001
dir = "in"
src = "198.18.0.2"
dst = "198.18.0.1"
suite = "aes256-sha256"
enc_key_file = "keys/enc"
integ_key_file = "` + integ + `"
`
	f, err := Parse(filepath.Join(dir, "espd.toml"), []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := ParseKey("k", shaKeyHex, 32)
	if c := f.SAs[0]; !bytes.Equal(c.EncKey, want) || !bytes.Equal(c.IntegKey, want) {
		t.Fatalf("keys: %d and %d bytes, not the files'", len(c.EncKey), len(c.IntegKey))
	}
	enc, integKey := f.SAs[0].EncKey, f.SAs[0].IntegKey
	f.Wipe()
	if !bytes.Equal(enc, make([]byte, 32)) || !bytes.Equal(integKey, make([]byte, 32)) {
		t.Error("Wipe left key bytes")
	}

	// Relative to the file's directory, not the working directory.
	if _, err := Parse(filepath.Join(t.TempDir(), "espd.toml"), []byte(text)); err == nil || !strings.Contains(err.Error(), "keys/enc") {
		t.Errorf("key file relative to another directory: %v", err)
	}
	// A key file others may read is refused, with the line of its SA.
	os.Chmod(filepath.Join(dir, "keys", "enc"), 0o644)
	_, err = Parse(filepath.Join(dir, "espd.toml"), []byte(text))
	var ce *Error
	if !errors.As(err, &ce) || ce.Line != 2 || !errors.Is(err, ErrKeyFileMode) {
		t.Errorf("world-readable key file: %v", err)
	}
	// A key file for a suite that takes no integrity key.
	os.Chmod(filepath.Join(dir, "keys", "enc"), 0o600)
	text2 := strings.Replace(strings.Replace(text, "aes256-sha256", "aes256gcm16", 1),
		`enc_key_file = "keys/enc"`, `enc_key = "`+shaKeyHex+`01020304"`, 1)
	if _, err := Parse(filepath.Join(dir, "espd.toml"), []byte(text2)); err == nil || !strings.Contains(err.Error(), "integ_key_file "+integ+" given, but the suite takes none") {
		t.Errorf("integrity key file for an AEAD: %v", err)
	}
}

// TestConfigDefaults checks that a table that sets nothing optional gets
// exactly sa.DefaultConfig, and that explicit values, 0 included, win.
func TestConfigDefaults(t *testing.T) {
	head := "[[sa]]\nspi = 0x1001\ndir = \"in\"\nsrc = \"198.18.0.2\"\ndst = \"198.18.0.1\"\nsuite = \"aes128gcm16\"\nenc_key = \"" + gcmKeyHex + "\"\n"
	f, err := Parse("gw.toml", []byte(head))
	if err != nil {
		t.Fatal(err)
	}
	got := f.SAs[0]
	want := sa.DefaultConfig()
	want.SPI, want.Dir, want.Src, want.Dst, want.Suite = got.SPI, sa.DirIn, got.Src, got.Dst, got.Suite
	want.EncKey = got.EncKey
	if got.String() != want.String() || got.ReplayWindow != sa.DefaultReplayWindow || !got.ECN || !got.CopyDSCP || got.DF != want.DF || got.TTL != 0 {
		t.Fatalf("defaults: got %v, want %v", got, want)
	}
	f, err = Parse("gw.toml", []byte(head+"replay_window = 0\necn = false\ndscp = \"46\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c := f.SAs[0]; c.ReplayWindow != 0 || c.ECN || c.CopyDSCP || c.DSCP != 46 {
		t.Fatalf("explicit values: %v", c)
	}
}
