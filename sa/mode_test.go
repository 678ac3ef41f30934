package sa

import (
	"errors"
	"strings"
	"testing"
)

// TestMode: modes parse and print as XFRM names them, and nothing else
// parses.
func TestMode(t *testing.T) {
	for _, m := range []Mode{ModeTunnel, ModeTransport} {
		got, err := ParseMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	for _, s := range []string{"", "beet", "Tunnel", "2"} {
		if _, err := ParseMode(s); err == nil {
			t.Errorf("ParseMode(%q) took it", s)
		}
	}
	if Mode(7).String() != "mode(7)" {
		t.Errorf("Mode(7) = %q", Mode(7).String())
	}
}

// TestSAMode: a transport-mode state keeps its mode, shows it, refuses TFC
// padding and an unknown mode, and an update cannot change the mode.
func TestSAMode(t *testing.T) {
	db, _ := newTestDB(t)
	c := testConfig(0x3100, DirOut, 7)
	c.Mode = ModeTransport
	s := mustAdd(t, db, c)
	if s.Mode() != ModeTransport {
		t.Fatalf("Mode() = %v", s.Mode())
	}
	if got := s.Config(); got.Mode != ModeTransport || !strings.Contains(got.String(), " mode transport") {
		t.Errorf("Config() = %v", got)
	}
	if tun := mustAdd(t, db, testConfig(0x3101, DirOut, 8)); tun.Mode() != ModeTunnel || strings.Contains(tun.Config().String(), "mode") {
		t.Errorf("default state: mode %v, %v", tun.Mode(), tun.Config())
	}

	u := testConfig(0x3100, DirOut, 7)
	u.EncKey, u.IntegKey = nil, nil
	var fe *FieldError
	if err := db.UpdateSA(u); !errors.As(err, &fe) || fe.Field != FieldMode {
		t.Errorf("UpdateSA to tunnel mode: %v, want FieldError %q", err, FieldMode)
	}
	u.Mode = ModeTransport
	if err := db.UpdateSA(u); err != nil {
		t.Errorf("UpdateSA keeping transport mode: %v", err)
	}

	bad := testConfig(0x3102, DirOut, 9)
	bad.Mode, bad.TFCPadTo = ModeTransport, 200
	if err := bad.Validate(); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "TFC") {
		t.Errorf("transport mode with TFC padding: %v", err)
	}
	bad.Mode, bad.TFCPadTo = Mode(5), 0
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "mode") {
		t.Errorf("unknown mode: %v", err)
	}
}

// TestPolicyMode: a policy's template mode is checked and shown.
func TestPolicyMode(t *testing.T) {
	p := Policy{Dir: DirOut, Action: ActionProtect, ReqID: 1, Mode: ModeTransport}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.String(), " mode transport") {
		t.Errorf("String() = %q", p.String())
	}
	p.Mode = 9
	if err := p.Validate(); err == nil {
		t.Error("policy with mode 9 validated")
	}
}
