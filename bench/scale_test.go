package main

import (
	"bytes"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/espd/espd/bench/report"
	"github.com/espd/espd/bench/system"
	"github.com/espd/espd/testbed"
)

func TestScaleOptions(t *testing.T) {
	var stderr bytes.Buffer
	pts := func(s ...int) []report.ScalePoint {
		var out []report.ScalePoint
		for i := 0; i < len(s); i += 2 {
			out = append(out, report.ScalePoint{Tunnels: s[i], Streams: s[i+1]})
		}
		return out
	}
	o, err := parseOptions(nil, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o.scale.on || len(o.scale.points) != 0 {
		t.Errorf("scale mode on by default: %+v", o.scale)
	}
	o, err = parseOptions([]string{"-scale"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !o.scale.on || !slices.Equal(o.scale.points, pts(1, 1, 16, 1, 256, 1, 1, 8)) ||
		!slices.Equal(o.systems, []string{"espd", "espd-udp", "libipsec", "wireguard-go"}) ||
		len(o.suites) != 1 || o.suites[0].String() != "aes128gcm16" || !slices.Equal(o.mss, []int{0}) ||
		o.reps != 3 || o.udp || o.ping || o.scale.probeRate != 4000 {
		t.Errorf("-scale: %+v", o)
	}
	// Explicit flags win over the scale mode's defaults.
	o, err = parseOptions([]string{"-scale", "-systems", "espd,routing", "-suites", "chacha20poly1305", "-mss", "1000", "-reps", "5"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.systems, []string{"routing", "espd"}) || o.suites[0].String() != "chacha20poly1305" ||
		!slices.Equal(o.mss, []int{1000}) || o.reps != 5 {
		t.Errorf("-scale with explicit flags: %+v", o)
	}
	// The AF_XDP systems are not among the defaults but may be named, and
	// carry many tunnels.
	if d := strings.Split(defaultScaleSystems, ","); slices.Contains(d, "espd-xdp") || slices.Contains(d, "espd-xdp-noaesni") {
		t.Errorf("scale defaults %v name an AF_XDP system", d)
	}
	o, err = parseOptions([]string{"-tunnels", "256", "-systems", "espd-xdp,espd-xdp-noaesni"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !o.scale.on || !slices.Equal(o.scale.points, pts(256, 1)) || !slices.Equal(o.systems, []string{"espd-xdp", "espd-xdp-noaesni"}) {
		t.Errorf("-tunnels 256 -systems espd-xdp,espd-xdp-noaesni: %+v", o)
	}
	for _, s := range system.All() {
		if _, ok := s.(system.Tunnels); slices.Contains(o.systems, s.Name()) && !ok {
			t.Errorf("%s carries one tunnel only", s.Name())
		}
	}
	// -tunnels and -streams: one point, and the scale mode.
	o, err = parseOptions([]string{"-tunnels", "4", "-streams", "2"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !o.scale.on || !slices.Equal(o.scale.points, pts(4, 2)) {
		t.Errorf("-tunnels 4 -streams 2: %+v", o.scale)
	}
	o, err = parseOptions([]string{"-streams", "8"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.scale.points, pts(1, 8)) {
		t.Errorf("-streams 8: %+v", o.scale.points)
	}
	o, err = parseOptions([]string{"-scale-points", "2x3, 64X1", "-quick"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !o.scale.on || !slices.Equal(o.scale.points, pts(2, 3, 64, 1)) || o.reps != 1 {
		t.Errorf("-scale-points 2x3,64X1 -quick: %+v", o)
	}
	for _, bad := range [][]string{
		{"-tunnels", "0"}, {"-streams", "0"}, {"-tunnels", "-3"},
		{"-tunnels", "1001"}, {"-streams", "65"}, {"-tunnels", "1000", "-streams", "5"},
		{"-scale-points", "16"}, {"-scale-points", "ax1"}, {"-scale-points", "1x1,1x1"}, {"-scale-points", ","},
		{"-scale-points", "0x1"}, {"-tunnels", "4", "-scale-points", "1x1"}, {"-scale", "-probe-rate", "5"},
	} {
		if _, err := parseOptions(bad, &stderr); err == nil {
			t.Errorf("parseOptions(%q) accepted", bad)
		}
	}
}

// TestScalePlan checks that a scale point's schedule is the matrix's:
// every per-suite system reps times per suite and MSS, the systems with
// their own cipher spread over the suite blocks, interleaved.
func TestScalePlan(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseOptions([]string{"-scale", "-suites", "aes128gcm16,chacha20poly1305", "-mss", "max,500"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	perSuite := []bool{true, true, true, false} // espd, espd-udp, libipsec, wireguard-go
	steps := scalePlan(o, perSuite)
	count := map[[2]int]int{}
	for _, s := range steps {
		if s.pt.kind != report.KindScale {
			t.Fatalf("step of kind %q", s.pt.kind)
		}
		count[[2]int{s.sys, s.pt.mss}]++
	}
	for sys, ps := range perSuite {
		for _, m := range o.mss {
			want := o.reps
			if ps {
				want *= len(o.suites)
			}
			if got := count[[2]int{sys, m}]; got != want {
				t.Errorf("system %d at MSS %d: %d runs, want %d", sys, m, got, want)
			}
		}
	}
	// Within a repetition the systems alternate.
	if steps[0].sys == steps[1].sys {
		t.Errorf("first two steps both of system %d", steps[0].sys)
	}
}

// TestTunnelAddrs checks the address plan: distinct hosts in the
// documentation ranges, each tunnel in its own block.
func TestTunnelAddrs(t *testing.T) {
	for _, f := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		seen := map[string]bool{}
		for i := range system.MaxTunnels {
			c, s := system.TunnelAddrs(f, i)
			for _, a := range []string{c.String(), s.String()} {
				if seen[a] {
					t.Fatalf("%v: %s twice", f, a)
				}
				seen[a] = true
			}
			if !testbed.Pick(f, system.TunnelClientV4, system.TunnelClientV6).Contains(c) ||
				!testbed.Pick(f, system.TunnelServerV4, system.TunnelServerV6).Contains(s) {
				t.Fatalf("%v tunnel %d: %v -> %v outside the ranges", f, i, c, s)
			}
		}
		c, _ := system.TunnelAddrs(f, 0)
		_, s := system.TunnelAddrs(f, 1)
		if want := testbed.Pick(f, "198.19.16.2", "2001:db8:e5d1::2"); c.String() != want {
			t.Errorf("%v: tunnel 0's client %v, want %s", f, c, want)
		}
		if want := testbed.Pick(f, "198.19.32.6", "2001:db8:e5d2::6"); s.String() != want {
			t.Errorf("%v: tunnel 1's server %v, want %s", f, s, want)
		}
	}
	v4, v6 := netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("2001:db8::/32")
	for _, p := range []netip.Prefix{system.TunnelClientV4, system.TunnelServerV4, system.TunnelClientV6, system.TunnelServerV6} {
		if !v4.Contains(p.Addr()) && !v6.Contains(p.Addr()) || p.Bits() < 15 {
			t.Errorf("tunnel range %v outside 198.18.0.0/15 and 2001:db8::/32", p)
		}
	}
}
