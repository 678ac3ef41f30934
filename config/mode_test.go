package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/espd/espd/sa"
)

// modePolicy is a [[policy]] table with extra keys.
func modePolicy(extra string) string {
	return "[[policy]]\nsrc = \"198.18.0.1/32\"\ndst = \"198.18.0.2/32\"\ndir = \"out\"\nreqid = 1\n" + extra
}

// TestParseMode: mode = "transport" gives a transport-mode state or
// policy template; "tunnel" and no mode at all give tunnel mode.
func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		extra string
		want  sa.Mode
	}{
		{"", sa.ModeTunnel},
		{"mode = \"tunnel\"\n", sa.ModeTunnel},
		{"mode = \"transport\"\n", sa.ModeTransport},
	} {
		f, err := Parse("gw.toml", []byte(seqSA("out", "aes128gcm16", tc.extra)+modePolicy(tc.extra)))
		if err != nil {
			t.Fatalf("%q: %v", tc.extra, err)
		}
		if len(f.SAs) != 1 || len(f.Policies) != 1 {
			t.Fatalf("%q: %d SAs, %d policies", tc.extra, len(f.SAs), len(f.Policies))
		}
		if f.SAs[0].Mode != tc.want || f.Policies[0].Mode != tc.want {
			t.Errorf("%q: sa mode %v, policy mode %v, want %v", tc.extra, f.SAs[0].Mode, f.Policies[0].Mode, tc.want)
		}
		f.Wipe()
	}
}

// TestParseModeErrors: an unknown mode, in an [[sa]] or a [[policy]], and
// TFC padding on a transport-mode SA are refused with the file, the
// table's line and the reason.
func TestParseModeErrors(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		line       int
		reason     string
	}{
		{"sa mode", "\n" + seqSA("out", "aes128gcm16", "mode = \"tun\"\n"), 2, `sa #1: mode "tun": want tunnel or transport`},
		{"sa mode case", seqSA("out", "aes128gcm16", "mode = \"Transport\"\n"), 1, `mode "Transport": want tunnel or transport`},
		{"sa mode beet", seqSA("out", "aes128gcm16", "mode = \"beet\"\n"), 1, `mode "beet": want tunnel or transport`},
		{"policy mode", modePolicy("") + "\n[[policy]]\nsrc = \"198.18.0.2/32\"\ndst = \"198.18.0.1/32\"\ndir = \"in\"\nreqid = 1\nmode = \"tunnle\"\n", 7,
			`policy #2: mode "tunnle": want tunnel or transport`},
		{"transport with tfc", seqSA("out", "aes128gcm16", "mode = \"transport\"\ntfc_pad_to = 300\n"), 1,
			"sa #1: state spi 0x00001001: transport mode takes no TFC padding (tfc 300)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse("gw.toml", []byte(tc.text))
			if err == nil {
				t.Fatalf("invalid file accepted: %+v", f)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *config.Error", err)
			}
			if ce.Line != tc.line {
				t.Errorf("line = %d, want %d (%v)", ce.Line, tc.line, err)
			}
			if !strings.Contains(err.Error(), tc.reason) || !strings.HasPrefix(err.Error(), "gw.toml:") {
				t.Errorf("error %q does not say gw.toml:...%q", err, tc.reason)
			}
		})
	}
	// Tunnel mode keeps its TFC padding.
	f, err := Parse("gw.toml", []byte(seqSA("out", "aes128gcm16", "mode = \"tunnel\"\ntfc_pad_to = 300\n")))
	if err != nil || f.SAs[0].TFCPadTo != 300 {
		t.Fatalf("tunnel mode with tfc_pad_to: %v", err)
	}
	f.Wipe()
}
