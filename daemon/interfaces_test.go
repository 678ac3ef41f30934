package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/espd/espd/config"
	"github.com/espd/espd/statefile"
)

// TestInterfacesRecord: the record of route-based interfaces reads back
// what was written; a missing file is none; an empty, trailerless (the
// format before the trailer), cut, altered or unparsable one is refused
// with statefile.ErrDamaged, never read as fewer interfaces or none.
func TestInterfacesRecord(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "interfaces")
	if got, err := ReadInterfaces(path); err != nil || got != nil {
		t.Fatalf("missing record: %v %v, want none", got, err)
	}
	want := []config.Interface{{Name: "rb2", IfID: 2}, {Name: "rb1", IfID: 1, MTU: 1380}}
	if err := WriteInterfaces(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadInterfaces(path)
	if err != nil || len(got) != 2 || got[0] != want[1] || got[1] != want[0] {
		t.Fatalf("read back %v %v, want %v sorted by if_id", got, err, want)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	legacy := "# espd's route-based interfaces (name if_id mtu), created at boot by espd --restore-holds\nrb1 1 1380\nrb2 2 0\n"
	damaged := map[string][]byte{
		"empty":         {},
		"trailerless":   []byte(legacy),
		"cut":           good[:len(good)-10],
		"cut in a line": good[:len(legacy)-3],
		"altered":       []byte(strings.Replace(string(good), "rb1 1 1380", "rb1 1 1280", 1)),
		"bad line":      statefile.Seal([]byte(interfacesHeader + "\nrb1 one 1380\n")),
		"bad name":      statefile.Seal([]byte(interfacesHeader + "\nrb/1 1 1380\n")),
		"bad mtu":       statefile.Seal([]byte(interfacesHeader + "\nrb1 1 100\n")),
		"no header":     statefile.Seal([]byte("rb1 1 1380\n")),
	}
	for name, data := range damaged {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadInterfaces(path)
		if !errors.Is(err, statefile.ErrDamaged) || got != nil {
			t.Errorf("%s: %v %v, want statefile.ErrDamaged", name, got, err)
		}
	}
	// The header alone is a record of no interfaces, not damage.
	if err := os.WriteFile(path, statefile.Seal([]byte(interfacesHeader+"\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadInterfaces(path); err != nil || len(got) != 0 {
		t.Errorf("header only: %v %v, want no interface", got, err)
	}
}
