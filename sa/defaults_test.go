package sa

import (
	"strings"
	"testing"

	"github.com/espd/espd/esp"
)

func TestDefaultConfig(t *testing.T) {
	d := DefaultConfig()
	want := Config{ReplayWindow: 128, ECN: true, CopyDSCP: true, DF: esp.DFCopy}
	if d.String() != want.String() || d.ReplayWindow != want.ReplayWindow || d.ECN != want.ECN ||
		d.CopyDSCP != want.CopyDSCP || d.DF != want.DF || d.TTL != 0 || d.DSCP != 0 || d.TFCPadTo != 0 ||
		d.ReqID != 0 || d.EncapSrcPort != 0 || d.EncapDstPort != 0 || d.Selectors != nil ||
		d.Soft != (Lifetime{}) || d.Hard != (Lifetime{}) || d.Suite.ESN {
		t.Fatalf("DefaultConfig() = %+v", d)
	}
	// At least strongSwan's 32 and RFC 4303's preferred 64.
	if DefaultReplayWindow < 64 || DefaultReplayWindow > esp.MaxReplayWindow {
		t.Fatalf("DefaultReplayWindow %d", DefaultReplayWindow)
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
			if err == nil || !strings.Contains(err.Error(), "reserved") || !strings.Contains(err.Error(), "RFC 4303") {
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
			if err == nil || !strings.Contains(err.Error(), "above the maximum of 65536") {
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
	if err := db.UpdateSA(up); err == nil || !strings.Contains(err.Error(), "above the maximum") {
		t.Errorf("UpdateSA with window %d: %v", up.ReplayWindow, err)
	}
}

func addErr(db *DB, c Config) error {
	_, err := db.AddSA(c)
	return err
}
