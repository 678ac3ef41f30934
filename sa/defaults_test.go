package sa

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/espd/espd/esp"
)

// TestDefaultConfig holds DefaultConfig to its contract rather than to its
// values: it is the per-state defaults and nothing else, a state made from
// it with an identity and keys is valid in either direction, and the
// replay window meets RFC 4303's floor (at least 32, 64 preferred).
func TestDefaultConfig(t *testing.T) {
	d := DefaultConfig()
	want := Config{ReplayWindow: DefaultReplayWindow, ECN: DefaultECN, CopyDSCP: DefaultCopyDSCP, DF: DefaultDF}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("DefaultConfig() = %+v, want the per-state defaults only: %+v", d, want)
	}
	if DefaultReplayWindow < 64 || DefaultReplayWindow > esp.MaxReplayWindow {
		t.Errorf("DefaultReplayWindow %d outside 64..%d", DefaultReplayWindow, esp.MaxReplayWindow)
	}
	for _, dir := range []Direction{DirIn, DirOut} {
		c := DefaultConfig()
		id := testConfig(0x4000, dir, 1)
		c.SPI, c.Dir, c.Src, c.Dst, c.Suite, c.EncKey = id.SPI, id.Dir, id.Src, id.Dst, id.Suite, id.EncKey
		if err := c.Validate(); err != nil {
			t.Errorf("%v state from DefaultConfig: %v", dir, err)
		}
	}
}

// TestValidateReserved checks that SPIs 0-255 and replay windows above
// esp.MaxReplayWindow are refused, by Validate and by AddSA and UpdateSA,
// and that an explicit window of 0 is accepted.
func TestValidateReserved(t *testing.T) {
	db := NewDB(Options{AcquireInterval: -1})
	for _, spi := range []uint32{0, 1, 2, 100, 255} {
		c := testConfig(spi, DirIn, 1)
		for name, err := range map[string]error{"Validate": c.Validate(), "AddSA": addErr(db, c)} {
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "RFC 4303") {
				t.Errorf("%s of SPI %d: %v, want a refusal naming RFC 4303", name, spi, err)
			}
		}
	}
	if err := testConfig(256, DirIn, 1).Validate(); err != nil {
		t.Errorf("SPI 256: %v", err)
	}

	for _, w := range []uint32{esp.MaxReplayWindow + 1, 1 << 20, ^uint32(0)} {
		c := testConfig(0x1000, DirIn, 1)
		c.ReplayWindow = w
		for name, err := range map[string]error{"Validate": c.Validate(), "AddSA": addErr(db, c)} {
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "maximum of 65536") {
				t.Errorf("%s of window %d: %v, want a refusal naming the maximum", name, w, err)
			}
		}
	}
	for _, w := range []uint32{0, 1, 32, esp.MaxReplayWindow} {
		c := testConfig(0x2000+w, DirIn, 1)
		c.ReplayWindow = w
		s, err := db.AddSA(c)
		if err != nil {
			t.Fatalf("window %d: %v", w, err)
		}
		if got := s.Config().ReplayWindow; got != w {
			t.Errorf("window %d installed as %d", w, got)
		}
	}
	// UpdateSA refuses an oversized window too.
	up := testConfig(0x2000, DirIn, 1)
	up.EncKey = nil
	up.ReplayWindow = esp.MaxReplayWindow + 64
	if err := db.UpdateSA(up); !errors.Is(err, ErrInvalid) {
		t.Errorf("UpdateSA with window %d: %v", up.ReplayWindow, err)
	}
}

func addErr(db *DB, c Config) error {
	_, err := db.AddSA(c)
	return err
}
