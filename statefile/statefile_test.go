package statefile

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestRoundTrip: what Write wrote, Read returns; a missing file is no
// record; the write leaves no temporary file behind.
func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rec")
	if body, found, err := Read(path); err != nil || found || body != nil {
		t.Fatalf("missing file: %q %v %v, want no record", body, found, err)
	}
	for _, body := range []string{"a 1 2\nb 3 4\n", "no newline", "\n"} {
		if err := Write(path, []byte(body)); err != nil {
			t.Fatal(err)
		}
		got, found, err := Read(path)
		want := body
		if want[len(want)-1] != '\n' {
			want += "\n"
		}
		if err != nil || !found || string(got) != want {
			t.Errorf("Write(%q): Read %q %v %v", body, got, found, err)
		}
	}
	if _, err := os.Stat(path + ".new"); !os.IsNotExist(err) {
		t.Errorf("temporary file left: %v", err)
	}
}

// TestDamageRefused: an empty file, one cut anywhere, one without a
// trailer, one with a byte changed or text after the trailer: each is
// refused with ErrDamaged, never read as a shorter or empty record.
func TestDamageRefused(t *testing.T) {
	good := Seal([]byte("# header\nrb1 1 1400\nrb2 2 0\n"))
	cases := map[string][]byte{
		"empty":          {},
		"trailerless":    []byte("# header\nrb1 1 1400\nrb2 2 0\n"),
		"flipped":        append([]byte("# header\nrb1 1 1500\n"), good[len("# header\nrb1 1 1400\n"):]...),
		"after trailer":  append(append([]byte{}, good...), "rb3 3 0\n"...),
		"trailer only":   []byte("espd-end 0 00000001\n"),
		"bad trailer":    []byte("x\nespd-end 2\n"),
		"count mismatch": []byte("x\nespd-end 3 00000000\n"),
	}
	for i := 1; i < len(good); i++ {
		cases["cut at "+strconv.Itoa(i)] = good[:i]
	}
	dir := t.TempDir()
	for name, data := range cases {
		path := filepath.Join(dir, "rec")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		body, found, err := Read(path)
		if !errors.Is(err, ErrDamaged) || !found || body != nil {
			t.Errorf("%s (%q): %q %v %v, want ErrDamaged", name, data, body, found, err)
		}
	}
}

// TestReplaceFails: a write that cannot be made is an error and leaves
// the record as it was.
func TestReplaceFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rec")
	if err := Write(path, []byte("old\n")); err != nil {
		t.Fatal(err)
	}
	// The temporary file's name is taken by a directory: the open fails.
	if err := os.Mkdir(path+".new", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new\n")); err == nil {
		t.Fatal("Write succeeded with its temporary file's name taken")
	}
	if body, _, err := Read(path); err != nil || string(body) != "old\n" {
		t.Errorf("after a failed write: %q %v, want the old record", body, err)
	}
	if err := Write(filepath.Join(dir, "nodir", "rec"), []byte("x\n")); err == nil {
		t.Error("Write into a missing directory succeeded")
	}
}
