package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/bench/report"
	"github.com/espd/espd/bench/system"
	"github.com/espd/espd/crypto"
)

func TestMakePlan(t *testing.T) {
	pts := []point{{"tcp", 0}, {"tcp", 200}, {"udp", 0}}
	perSuite := []bool{false, true, true, false} // routing, espd, libipsec, wireguard-go
	const blocks, reps = 6, 3
	steps := makePlan(blocks, pts, reps, perSuite)
	count := map[string]int{}
	blocksOf := map[int][]int{}
	for _, s := range steps {
		count[fmt.Sprint(s.sys, s.pt, s.block)]++
		if !perSuite[s.sys] && s.pt == pts[0] {
			blocksOf[s.sys] = append(blocksOf[s.sys], s.block)
		}
	}
	for sys, ps := range perSuite {
		for b := range blocks {
			for _, p := range pts {
				n := count[fmt.Sprint(sys, p, b)]
				if ps && n != reps {
					t.Errorf("per-suite system %d: %d runs of %v in block %d, want %d", sys, n, p, b, reps)
				}
			}
		}
	}
	// Systems with their own cipher make reps runs per point, spread
	// over the blocks.
	for _, sys := range []int{0, 3} {
		if got := blocksOf[sys]; !slices.Equal(got, []int{0, 2, 4}) {
			t.Errorf("system %d runs in blocks %v, want [0 2 4]", sys, got)
		}
	}
	if want := blocks*len(pts)*reps*2 + len(pts)*reps*2; len(steps) != want {
		t.Errorf("%d steps, want %d", len(steps), want)
	}
	// Interleaved: within a point of a block, the systems alternate, and
	// the first system rotates with the repetition.
	var firsts []int
	for i, s := range steps {
		if s.block == 1 && s.pt == pts[1] && (i == 0 || steps[i-1].rep != s.rep || steps[i-1].pt != s.pt) {
			firsts = append(firsts, s.sys)
		}
	}
	if !slices.Equal(firsts, []int{1, 1, 2}) {
		t.Errorf("first system of each repetition in block 1: %v", firsts)
	}
	// One block: all runs there.
	for _, s := range makePlan(1, pts, reps, perSuite) {
		if s.block != 0 {
			t.Fatalf("step in block %d of 1", s.block)
		}
	}
}

func TestOptions(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseOptions([]string{"-quick"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.systems, []string{"routing", "espd"}) || len(o.suites) != 1 || o.suites[0].String() != "aes128gcm16" ||
		!slices.Equal(o.mss, []int{0}) || o.duration != 2*time.Second || o.reps != 1 || o.udp || o.ping {
		t.Errorf("-quick: %+v", o)
	}
	o, err = parseOptions([]string{"-quick", "-reps", "2", "-mss", "max,500", "-systems", "all"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o.reps != 2 || !slices.Equal(o.mss, []int{0, 500}) || len(o.systems) != len(systemNames()) {
		t.Errorf("-quick with explicit flags: reps %d mss %v systems %v", o.reps, o.mss, o.systems)
	}
	o, err = parseOptions([]string{"-systems", "wireguard-go,espd", "-noaesni", "-6"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"espd", "espd-noaesni", "wireguard-go", "wireguard-go-noaesni"}; !slices.Equal(o.systems, want) {
		t.Errorf("-noaesni systems %v, want %v", o.systems, want)
	}
	o2, err := parseOptions([]string{"-systems", "routing,espd-udp,libipsec", "-noaesni"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"routing", "espd-noaesni", "espd-udp", "espd-udp-noaesni", "libipsec", "libipsec-noaesni"}; !slices.Equal(o2.systems, want) {
		t.Errorf("-noaesni twins: systems %v, want %v", o2.systems, want)
	}
	o3, err := parseOptions([]string{"-systems", "espd-xdp,espd-udp", "-noaesni"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"espd-noaesni", "espd-xdp", "espd-xdp-noaesni", "espd-udp", "espd-udp-noaesni"}; !slices.Equal(o3.systems, want) {
		t.Errorf("-noaesni twin of espd-xdp: systems %v, want %v", o3.systems, want)
	}
	if len(o.suites) != 7 || !slices.Equal(o.mss, []int{0, 1000, 500, 200}) || o.reps != 3 || o.family != 6 {
		t.Errorf("defaults: %+v", o)
	}
	if !slices.Contains(o.suiteNames, "aes256-sha384") {
		t.Errorf("default suites %v lack aes256-sha384", o.suiteNames)
	}
	if o, err := parseOptions(nil, &stderr); err != nil || !slices.Equal(o.systems[:4], []string{"routing", "espd", "xfrm", "xfrm-pcrypt"}) {
		t.Errorf("default systems: %v %v", o.systems, err)
	}
	// The kernel-only suites: XFRM runs them, espd refuses them when keyed.
	o, err = parseOptions([]string{"-suites", "3des-sha1,camellia128-sha256,aes256-sha384"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"3des-sha1", "camellia128-sha256", "aes256-sha384"}; !slices.Equal(o.suiteNames, want) || len(o.suites) != 3 ||
		o.suites[0].Encryption != crypto.Encr3DES || o.suites[1].Encryption != crypto.EncrCamelliaCBC {
		t.Errorf("-suites 3des-sha1,camellia128-sha256,aes256-sha384: %v %+v", o.suiteNames, o.suites)
	}
	for _, bad := range [][]string{
		{"-systems", "ipsec-tools"}, {"-suites", "des-sha1"}, {"-suites", "3des"}, {"-mss", "20"}, {"-mss", "big"},
		{"-reps", "0"}, {"-tool", "netperf"}, {"-duration", "1ms"}, {"extra"},
		{"-xfrm-guest", "-render", "x.json"}, {"-xfrm-guest", "-guest-memory", "64"}, {"-xfrm-guest", "-espd", "/usr/sbin/espd"},
	} {
		if _, err := parseOptions(bad, &stderr); err == nil {
			t.Errorf("parseOptions(%q) accepted", bad)
		}
	}
}

// TestDefaultRatiosSystems: every system the report's default ratios
// compare is one the harness knows, the AF_XDP systems among them.
func TestDefaultRatiosSystems(t *testing.T) {
	known := systemNames()
	for _, name := range []string{"espd-xdp", "espd-xdp-noaesni"} {
		if !slices.Contains(known, name) {
			t.Errorf("systems %v lack %s", known, name)
		}
	}
	for _, p := range report.DefaultRatios {
		if !slices.Contains(known, p.Subject) || !slices.Contains(known, p.Peer) || p.Subject == p.Peer {
			t.Errorf("ratio %s vs %s: not two known systems", p.Subject, p.Peer)
		}
	}
	for _, want := range []report.Ratio{
		{Subject: "espd-xdp", Peer: "espd-udp"}, {Subject: "espd-xdp-noaesni", Peer: "espd-udp-noaesni"},
		{Subject: "espd-xdp", Peer: "espd"}, {Subject: "espd-xdp-noaesni", Peer: "espd-noaesni"},
		{Subject: "espd-xdp-noaesni", Peer: "wireguard-go-noaesni"},
	} {
		if !slices.Contains(report.DefaultRatios, want) {
			t.Errorf("default ratios lack %s vs %s", want.Subject, want.Peer)
		}
	}
}

// TestGuestOptions checks -xfrm-guest's defaults, that explicit flags
// override them, and the flags the harness inside the guest gets.
func TestGuestOptions(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseOptions([]string{"-xfrm-guest"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !o.xfrmGuest || !slices.Equal(o.systems, []string{"routing", "espd", "xfrm", "xfrm-pcrypt"}) ||
		!slices.Equal(o.suiteNames, []string{"aes128gcm16", "aes128-sha256"}) || !slices.Equal(o.mss, []int{0}) ||
		o.duration != time.Second || o.omit != 200*time.Millisecond || o.reps != 1 || o.udp || !o.ping || o.pingCount != 3 ||
		o.guestMemoryMB != 1024 {
		t.Errorf("-xfrm-guest defaults: %+v", o)
	}
	o, err = parseOptions([]string{"-xfrm-guest", "-suites", "3des-sha1", "-reps", "2", "-udp", "-6", "-mss", "max,500", "-v"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o.reps != 2 || !o.udp || !slices.Equal(o.suiteNames, []string{"3des-sha1"}) || !slices.Equal(o.mss, []int{0, 500}) {
		t.Errorf("-xfrm-guest with explicit flags: %+v", o)
	}
	args := strings.Join(guestArgs(o), " ")
	for _, want := range []string{"-systems routing,espd,xfrm,xfrm-pcrypt", "-suites 3des-sha1", "-mss max,500", "-reps 2",
		"-udp=true", "-ping=true", "-ping-count 3", "-6=true", "-duration 1s", "-omit 200ms", "-espd " + guestEspd, "-out " + guestOut, "-v"} {
		if !strings.Contains(args, want) {
			t.Errorf("guest arguments %q lack %q", args, want)
		}
	}
	// What the guest gets parses back to the same settings.
	back, err := parseOptions(guestArgs(o), &stderr)
	if err != nil {
		t.Fatalf("the guest's arguments: %v", err)
	}
	if back.xfrmGuest || !slices.Equal(back.systems, o.systems) || !slices.Equal(back.suiteNames, o.suiteNames) ||
		!slices.Equal(back.mss, o.mss) || back.reps != o.reps || back.udp != o.udp || back.family != o.family || back.espdBin != guestEspd {
		t.Errorf("the guest parses %+v from %q", back, guestArgs(o))
	}
	if got := shellQuote("it's"); got != `'it'\''s'` {
		t.Errorf("shellQuote: %s", got)
	}
}

// TestHostToHostOptions: the host-to-host systems are known by name, come
// after the gateway systems in report order, have no no-AES-NI twins, go
// into the guest as given, and the default ratios compare them.
func TestHostToHostOptions(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseOptions([]string{"-systems", "xfrm-transport,espd-transport-udp,espd-transport,hosts-plain,espd,routing", "-noaesni"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"routing", "espd", "espd-noaesni", "hosts-plain", "espd-transport", "espd-transport-udp", "xfrm-transport"}; !slices.Equal(o.systems, want) {
		t.Errorf("systems %v, want %v", o.systems, want)
	}
	g, err := parseOptions([]string{"-xfrm-guest", "-systems", "hosts-plain,xfrm-transport,espd-transport"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(guestArgs(g), " "); !strings.Contains(args, "-systems hosts-plain,espd-transport,xfrm-transport") {
		t.Errorf("guest arguments %q", args)
	}
	for _, want := range []report.Ratio{
		{Subject: "espd-transport", Peer: "hosts-plain"}, {Subject: "espd-transport", Peer: "espd"},
		{Subject: "espd-transport-udp", Peer: "espd-transport"}, {Subject: "espd-transport", Peer: "xfrm-transport"},
	} {
		if !slices.Contains(report.DefaultRatios, want) {
			t.Errorf("default ratios lack %s vs %s", want.Subject, want.Peer)
		}
	}
}

// TestNoAESNIXFRMTwins checks that -noaesni adds the kernel XFRM rows on
// generic drivers beside xfrm and xfrm-pcrypt (each only where its original
// is asked for), in report order after them, that they are XFRM systems
// with NoAESNI set, and that a guest run passes them on.
func TestNoAESNIXFRMTwins(t *testing.T) {
	var stderr bytes.Buffer
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"-systems", "xfrm-pcrypt,routing,xfrm", "-noaesni"},
			[]string{"routing", "espd-noaesni", "xfrm", "xfrm-pcrypt", "xfrm-noaesni", "xfrm-pcrypt-noaesni"}},
		{[]string{"-systems", "xfrm-pcrypt", "-noaesni"}, []string{"espd-noaesni", "xfrm-pcrypt", "xfrm-pcrypt-noaesni"}},
		{[]string{"-systems", "espd,xfrm", "-noaesni"}, []string{"espd", "espd-noaesni", "xfrm", "xfrm-noaesni"}},
		{[]string{"-systems", "espd,xfrm,xfrm-pcrypt"}, []string{"espd", "xfrm", "xfrm-pcrypt"}},
		{[]string{"-systems", "xfrm-noaesni"}, []string{"xfrm-noaesni"}},
	} {
		o, err := parseOptions(c.args, &stderr)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if !slices.Equal(o.systems, c.want) {
			t.Errorf("%v: systems %v, want %v", c.args, o.systems, c.want)
		}
	}
	o, err := parseOptions([]string{"-noaesni"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	for _, twin := range []string{"xfrm-noaesni", "xfrm-pcrypt-noaesni"} {
		if !slices.Contains(o.systems, twin) {
			t.Errorf("default systems with -noaesni %v lack %s", o.systems, twin)
		}
	}
	want := map[string][2]bool{"xfrm": {false, false}, "xfrm-pcrypt": {true, false}, "xfrm-noaesni": {false, true}, "xfrm-pcrypt-noaesni": {true, true}}
	for _, s := range system.All() {
		x, ok := s.(*system.XFRM)
		if !ok {
			continue
		}
		w, known := want[s.Name()]
		if !known || x.Pcrypt != w[0] || x.NoAESNI != w[1] || strings.Contains(s.Label(), "no AES-NI") != w[1] {
			t.Errorf("%s (%q): Pcrypt %v, NoAESNI %v", s.Name(), s.Label(), x.Pcrypt, x.NoAESNI)
		}
		delete(want, s.Name())
	}
	if len(want) > 0 {
		t.Errorf("systems missing: %v", want)
	}
	for _, r := range []report.Ratio{{Subject: "espd-noaesni", Peer: "xfrm-noaesni"}, {Subject: "espd-udp-noaesni", Peer: "xfrm-noaesni"},
		{Subject: "espd-noaesni", Peer: "xfrm-pcrypt-noaesni"}} {
		if !slices.Contains(report.DefaultRatios, r) {
			t.Errorf("default ratios lack %s vs %s", r.Subject, r.Peer)
		}
	}
	o, err = parseOptions([]string{"-xfrm-guest", "-noaesni", "-systems", "routing,xfrm,xfrm-pcrypt"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	back, err := parseOptions(guestArgs(o), &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"routing", "espd-noaesni", "xfrm", "xfrm-pcrypt", "xfrm-noaesni", "xfrm-pcrypt-noaesni"}; !slices.Equal(o.systems, want) || !slices.Equal(back.systems, want) {
		t.Errorf("-xfrm-guest -noaesni: systems %v, in the guest %v; want %v", o.systems, back.systems, want)
	}
}
