package system

import (
	"slices"
	"strings"
	"testing"

	"github.com/espd/espd/testbed"
)

// TestEspdXDP: the AF_XDP systems are raw-ESP espd (their no-AES-NI twin
// with NoAESNI) whose espd gets -xdp naming the gateway's transit link on
// both gateways; the other espd systems' espd gets no -xdp.
func TestEspdXDP(t *testing.T) {
	want := map[string]struct {
		xdp     string
		godebug string
	}{
		"espd":             {"", ""},
		"espd-noaesni":     {"", NoAESNI},
		"espd-udp":         {"", ""},
		"espd-xdp":         {"auto", ""},
		"espd-xdp-noaesni": {"auto", NoAESNI},
		"espd-xdp-native":  {"native", ""},
	}
	env := &Env{EspdBin: "/x/espd"}
	seen := 0
	for _, s := range All() {
		w, ok := want[s.Name()]
		if !ok {
			continue
		}
		seen++
		e := s.(*Espd)
		if e.xdp != w.xdp || e.godebug != w.godebug || e.baseline || e.encap && w.xdp != "" {
			t.Errorf("%s: %+v", s.Name(), e)
		}
		if err := e.Available(env); err != nil {
			t.Errorf("%s unavailable: %v", s.Name(), err)
		}
		for _, role := range []string{"gwA", "gwB"} {
			argv := espdArgv(e.bin(env), "/run/bench", role, e.godebug, e.flags(env)...)
			xdpArgs := slices.DeleteFunc(slices.Clone(argv), func(a string) bool { return !strings.HasPrefix(strings.TrimLeft(a, "-"), "xdp") })
			if w.xdp != "" && !slices.Equal(xdpArgs, []string{"-xdp=" + testbed.IfTransit, "-xdp-mode=" + w.xdp}) || w.xdp == "" && len(xdpArgs) > 0 {
				t.Errorf("%s on %s: argv %q, want -xdp=%s in mode %q", s.Name(), role, argv, testbed.IfTransit, w.xdp)
			}
			if g := slices.Contains(argv, "GODEBUG="+NoAESNI); g != (w.godebug == NoAESNI) {
				t.Errorf("%s on %s: argv %q, want GODEBUG %q", s.Name(), role, argv, w.godebug)
			}
			if !slices.Contains(argv, espdSocket("/run/bench", role)) {
				t.Errorf("%s on %s: argv %q lacks the control socket", s.Name(), role, argv)
			}
		}
	}
	if seen != len(want) {
		t.Errorf("All() has %d of the systems %v", seen, want)
	}
	// The profile flag comes with -xdp, not instead of it.
	if f := NewEspdXDP("x", "x", "", "auto").flags(&Env{Profile: true}); !slices.Equal(f, []string{"--pprof-listen", ProfileAddr, "-xdp=" + xdpDev, "-xdp-mode=auto"}) {
		t.Errorf("flags with Env.Profile: %q", f)
	}
}
