package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/bench/report"
	"github.com/espd/espd/bench/system"
	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/testbed"
	"github.com/espd/espd/xfrmguest"
)

// guestCommand returns the -xfrm-guest command BENCHMARKS.md documents in
// its fenced block marked marker ("```sh bench xfrm-guest"), as arguments
// of the harness. The block must be the only one with that marker and hold
// one command, "sudo go run ./bench ...".
func guestCommand(t *testing.T, marker string) []string {
	t.Helper()
	blocks, err := docblock.Blocks("../BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	m := docblock.Marked(blocks, marker)
	if len(m) != 1 || m[0].Lang != "sh" {
		t.Fatalf("BENCHMARKS.md: want one sh block marked %q, have %+v", marker, m)
	}
	lines := strings.Split(strings.TrimSpace(m[0].Text), "\n")
	args, ok := strings.CutPrefix(lines[0], "sudo go run ./bench ")
	if len(lines) != 1 || !ok || !strings.Contains(args, "-xfrm-guest") {
		t.Fatalf("BENCHMARKS.md line %d: block %q holds %q, want one line \"sudo go run ./bench -xfrm-guest ...\"", m[0].Line, marker, m[0].Text)
	}
	return strings.Fields(args)
}

// runGuestCommand runs BENCHMARKS.md's command in the block marked marker
// in process, with its outputs in a temporary directory, which it returns.
// It skips only where qemu cannot run at all, and fails instead under
// CI=true.
func runGuestCommand(t *testing.T, marker string) string {
	t.Helper()
	if err := testbed.Available(); err != nil {
		t.Skip(err)
	}
	if err := xfrmguest.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	out := t.TempDir()
	args := guestCommand(t, marker)
	for i := range args {
		if args[i] == "-out" && i+1 < len(args) {
			args[i+1] = out
		}
	}
	if !slices.Contains(args, out) {
		args = append(args, "-out", out)
	}
	var stdout, stderr bytes.Buffer
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("bench %s: %v\nstderr:\n%s\nstdout:\n%s", strings.Join(args, " "), err, stderr.String(), stdout.String())
	}
	t.Logf("stdout:\n%s", stdout.String())
	return out
}

// TestGuestCommandsDocumented checks, without root or qemu, that
// BENCHMARKS.md has the blocks TestXFRMGuest, TestXFRMGuestScale,
// TestXFRMGuestTransport and TestXFRMGuestNoAESNI run and that each is a harness command line the
// harness accepts.
func TestGuestCommandsDocumented(t *testing.T) {
	for _, marker := range []string{"bench xfrm-guest", "bench xfrm-guest-scale", "bench xfrm-guest-transport", "bench xfrm-guest-noaesni"} {
		var stderr bytes.Buffer
		o, err := parseOptions(guestCommand(t, marker), &stderr)
		if err != nil || !o.xfrmGuest {
			t.Errorf("%s: the harness parses %+v, %v\n%s", marker, o, err, stderr.String())
		}
	}
}

// TestXFRMGuest runs BENCHMARKS.md's "go run ./bench -xfrm-guest" command
// (the block marked "bench xfrm-guest") in process (with its outputs in a temporary directory): the harness,
// built static, runs inside Debian's kernel under qemu with routing,
// espd, kernel XFRM and XFRM with pcrypt, for an AEAD (aes128gcm16), a CBC
// suite (aes128-sha256) and the suites only the kernel does (3des-sha1,
// camellia128-sha256). It fails unless the XFRM rows, and xfrm-pcrypt's
// for the AEAD, have figures, every tunnel's states counted the packets
// of each run, pcrypt says why it does not do CBC, espd says it refuses
// 3DES and Camellia, and every figure is labelled as an emulated
// correctness run.
func TestXFRMGuest(t *testing.T) {
	out := runGuestCommand(t, "bench xfrm-guest")

	rep, err := report.ReadJSON(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Emulated != GuestLabel || !strings.Contains(rep.Machine.Hypervisor, "qemu TCG") || rep.Machine.Cores != 1 {
		t.Errorf("the report is not labelled as emulated: %q, machine %+v", rep.Emulated, rep.Machine)
	}
	// Every run of a tunnel succeeded and its states counted packets.
	ok := map[string]int{}
	for _, r := range rep.Runs {
		cell := fmt.Sprintf("%s %s %s", r.System, r.Suite, r.Kind)
		if !r.OK() {
			t.Errorf("%s failed: %s", cell, r.Error)
			continue
		}
		if r.System != "routing" && (r.SA == nil || r.SA.OutPackets == 0 || r.SA.InPackets == 0) {
			t.Errorf("%s: the states counted %+v", cell, r.SA)
			continue
		}
		if r.Kind == report.KindTCP && r.BitsPerSecond <= 0 {
			t.Errorf("%s: %v bit/s", cell, r.BitsPerSecond)
			continue
		}
		ok[cell]++
	}
	want := map[string]string{} // cell -> "" (figures) or the reason it has none
	var aeads, cbcs, refused int
	for _, name := range rep.Suites {
		s, err := system.ParseSuite(name)
		if err != nil {
			t.Fatal(err)
		}
		set := func(sys, reason string) {
			for _, kind := range []string{report.KindTCP, report.KindPing} {
				want[fmt.Sprintf("%s %s %s", sys, name, kind)] = reason
			}
		}
		set("xfrm", "")
		switch {
		case s.AEAD():
			aeads++
			set("xfrm-pcrypt", "")
		default:
			cbcs++
			set("xfrm-pcrypt", "pcrypt wraps AEADs only")
		}
		if s.Validate() != nil {
			refused++
			set("espd", system.RefusedByEspd)
		} else {
			set("espd", "")
		}
	}
	if aeads == 0 || cbcs == 0 || refused == 0 {
		t.Fatalf("BENCHMARKS.md's guest run has %d AEAD, %d CBC and %d suites espd refuses: it needs each", aeads, cbcs, refused)
	}
	want["routing  tcp"], want["routing  ping"] = "", ""
	for cell, reason := range want {
		sys, suite, _ := strings.Cut(cell, " ")
		suite, _, _ = strings.Cut(suite, " ")
		switch {
		case reason == "" && ok[cell] != 1:
			t.Errorf("%s: %d good runs, want 1", cell, ok[cell])
		case reason != "":
			s, _ := rep.System(sys)
			if ok[cell] != 0 || !strings.Contains(s.Unavailable[suite], reason) {
				t.Errorf("%s: %d runs, unavailable %q, want %q", cell, ok[cell], s.Unavailable[suite], reason)
			}
		}
	}
	for _, s := range rep.Systems {
		if s.Skipped != "" || len(s.Failed) > 0 {
			t.Errorf("%s: skipped %q, failed %v", s.Name, s.Skipped, s.Failed)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "tables.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Emulated correctness run (qemu TCG, 1 vCPU: says nothing about speed): it shows", "**Emulated correctness run (qemu TCG, 1 vCPU: says nothing about speed). TCP goodput",
		"| kernel XFRM, pcrypt | aes128gcm16 |", "refused by espd (RFC 8221)"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("tables.md lacks %q:\n%s", want, md)
		}
	}
	if bytes.Contains(md, []byte("Ratios of medians")) {
		t.Errorf("an emulated run has a table of speed ratios:\n%s", md)
	}
	if svg, err := os.ReadFile(filepath.Join(out, "throughput.svg")); err != nil || !bytes.Contains(svg, []byte("says nothing about speed")) {
		t.Errorf("the chart is not labelled (%v)", err)
	}
	if left, _ := filepath.Glob(filepath.Join(testbed.NetnsDir, fmt.Sprintf("%s-*-%d-*", namespacePrefix, os.Getpid()))); len(left) > 0 {
		t.Errorf("namespaces left behind: %v", left)
	}
}

// TestXFRMGuestScale runs BENCHMARKS.md's "go run ./bench -xfrm-guest
// -tunnels" command (the block marked "bench xfrm-guest-scale"): the scale mode inside Debian's kernel, where kernel
// XFRM (and XFRM on pcrypt) key one state pair and policy pair per tunnel,
// as espd does. It fails unless each system made its run, every tunnel's
// states counted packets both ways and its probe datagrams arrived, and
// the tables say the run is emulated.
func TestXFRMGuestScale(t *testing.T) {
	out := runGuestCommand(t, "bench xfrm-guest-scale")
	rep, err := report.ReadJSON(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Emulated != GuestLabel || len(rep.ScalePoints) != 1 {
		t.Fatalf("report: emulated %q, scale points %v", rep.Emulated, rep.ScalePoints)
	}
	p := rep.ScalePoints[0]
	ok := map[string]int{}
	for _, r := range rep.Runs {
		if r.Kind != report.KindScale || r.Scale == nil {
			t.Errorf("%s: a %s run in a scale run", r.System, r.Kind)
			continue
		}
		if !r.OK() {
			t.Errorf("%s %s: failed: %s", r.System, r.Suite, r.Error)
			continue
		}
		if len(r.Scale.PerTunnel) != p.Tunnels {
			t.Errorf("%s: %d tunnels recorded, want %d", r.System, len(r.Scale.PerTunnel), p.Tunnels)
			continue
		}
		for i, tr := range r.Scale.PerTunnel {
			if tr.SA == nil || tr.SA.OutPackets == 0 || tr.SA.InPackets == 0 || tr.ProbeReceived == 0 || tr.Bytes == 0 {
				t.Errorf("%s tunnel %d: states %+v, %d probe datagrams received, %d bytes", r.System, i, tr.SA, tr.ProbeReceived, tr.Bytes)
			}
		}
		ok[r.System]++
	}
	for _, sys := range []string{"xfrm", "xfrm-pcrypt", "espd"} {
		if ok[sys] != 1 {
			t.Errorf("%s: %d good scale runs, want 1", sys, ok[sys])
		}
	}
	for _, s := range rep.Systems {
		if s.Skipped != "" || len(s.Failed) > 0 || len(s.Unavailable) > 0 {
			t.Errorf("%s: skipped %q, failed %v, unavailable %v", s.Name, s.Skipped, s.Failed, s.Unavailable)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "tables.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(md, []byte("**Emulated correctness run (qemu TCG, 1 vCPU: says nothing about speed). Many tunnels")) {
		t.Errorf("tables.md's scale tables are not labelled:\n%s", md)
	}
}

// TestXFRMGuestTransport runs BENCHMARKS.md's host-to-host command in the
// guest (the block marked "bench xfrm-guest-transport"): the kernel's XFRM
// in transport mode between gwA and gwB beside espd's transport mode and
// the hosts in the clear. It fails unless every system has figures for
// every suite (the hosts in the clear for their own cipher), the states of
// both transport modes counted every run's packets, and the rows are the
// host-to-host group's, labelled as an emulated correctness run.
func TestXFRMGuestTransport(t *testing.T) {
	out := runGuestCommand(t, "bench xfrm-guest-transport")
	rep, err := report.ReadJSON(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Emulated != GuestLabel {
		t.Errorf("the report is not labelled as emulated: %q", rep.Emulated)
	}
	ok := map[string]int{}
	for _, r := range rep.Runs {
		cell := fmt.Sprintf("%s %s %s", r.System, r.Suite, r.Kind)
		switch {
		case !r.OK():
			t.Errorf("%s failed: %s", cell, r.Error)
		case r.System != "hosts-plain" && (r.SA == nil || r.SA.OutPackets == 0 || r.SA.InPackets == 0 || r.SA.InDrops != 0):
			t.Errorf("%s: the states counted %+v", cell, r.SA)
		default:
			ok[cell]++
		}
	}
	want := []string{"hosts-plain  tcp", "hosts-plain  ping"}
	for _, suite := range rep.Suites {
		for _, sys := range []string{"xfrm-transport", "espd-transport"} {
			want = append(want, fmt.Sprintf("%s %s tcp", sys, suite), fmt.Sprintf("%s %s ping", sys, suite))
		}
	}
	for _, cell := range want {
		if ok[cell] != 1 {
			t.Errorf("%s: %d good runs, want 1", cell, ok[cell])
		}
	}
	if len(rep.Systems) != 3 {
		t.Errorf("systems %+v, want hosts-plain, espd-transport and xfrm-transport", rep.Systems)
	}
	for _, s := range rep.Systems {
		if s.Group != system.HostToHostGroup || s.Skipped != "" || len(s.Failed) > 0 || len(s.Unavailable) > 0 {
			t.Errorf("%s: group %q, skipped %q, failed %v, unavailable %v", s.Name, s.Group, s.Skipped, s.Failed, s.Unavailable)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "tables.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"**Emulated correctness run (qemu TCG, 1 vCPU: says nothing about speed). TCP goodput",
		"| host to host, transport mode: kernel XFRM | aes128gcm16 |", "gwA -> gwB"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("tables.md lacks %q:\n%s", want, md)
		}
	}
}

// TestXFRMGuestNoAESNI runs BENCHMARKS.md's "-xfrm-guest -noaesni" command
// (the block marked "bench xfrm-guest-noaesni"): kernel XFRM and XFRM on
// pcrypt beside their no-AES-NI twins, in one run, inside Debian's kernel.
// It fails unless every twin keys, pings and carries TCP for every suite
// (xfrm-pcrypt-noaesni for the AEADs, with pcrypt's reason for CBC), every
// run's states counted its packets, and the guest's /proc/crypto showed
// each twin's states on the suite's generic driver (pcrypt(<it>) for
// pcrypt) and the plain rows' on the x86 drivers the guest loads
// (rfc4106-gcm-aesni, chacha20-simd, cbc-aes-aesni), pcrypt only where
// asked for.
func TestXFRMGuestNoAESNI(t *testing.T) {
	out := runGuestCommand(t, "bench xfrm-guest-noaesni")
	rep, err := report.ReadJSON(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Emulated != GuestLabel {
		t.Errorf("the report is not labelled as emulated: %q", rep.Emulated)
	}
	ok := map[string]int{}
	for _, r := range rep.Runs {
		cell := fmt.Sprintf("%s %s %s", r.System, r.Suite, r.Kind)
		switch {
		case !r.OK():
			t.Errorf("%s failed: %s", cell, r.Error)
		case r.System != "routing" && (r.SA == nil || r.SA.OutPackets == 0 || r.SA.InPackets == 0 || r.SA.InDrops != 0):
			t.Errorf("%s: the states counted %+v", cell, r.SA)
		case r.Kind == report.KindTCP && r.BitsPerSecond <= 0:
			t.Errorf("%s: %v bit/s", cell, r.BitsPerSecond)
		default:
			ok[cell]++
		}
	}
	// The generic driver each suite's states must be built on.
	generic := map[string]string{
		"aes128gcm16":      "rfc4106(gcm_base(ctr(aes-generic),ghash-generic))",
		"chacha20poly1305": "rfc7539esp(chacha20-generic,poly1305-generic)",
		"aes128-sha256":    "aes-generic)",
	}
	var aeads, cbcs int
	for _, name := range rep.Suites {
		s, err := system.ParseSuite(name)
		if err != nil {
			t.Fatal(err)
		}
		g := generic[name]
		if g == "" {
			t.Fatalf("BENCHMARKS.md's command has suite %s, which this test does not know", name)
		}
		systems := []string{"xfrm", "xfrm-noaesni"}
		if s.AEAD() {
			aeads++
			systems = append(systems, "xfrm-pcrypt", "xfrm-pcrypt-noaesni")
		} else {
			cbcs++
			for _, sys := range []string{"xfrm-pcrypt", "xfrm-pcrypt-noaesni"} {
				if info, _ := rep.System(sys); !strings.Contains(info.Unavailable[name], "pcrypt wraps AEADs only") {
					t.Errorf("%s %s: unavailable %q, want pcrypt's reason", sys, name, info.Unavailable[name])
				}
			}
		}
		for _, sys := range systems {
			for _, kind := range []string{report.KindTCP, report.KindPing} {
				if cell := fmt.Sprintf("%s %s %s", sys, name, kind); ok[cell] != 1 {
					t.Errorf("%s: %d good runs, want 1", cell, ok[cell])
				}
			}
			info, _ := rep.System(sys)
			d := info.Drivers[name]
			noAESNI, pcrypt := strings.HasSuffix(sys, "-noaesni"), strings.Contains(sys, "pcrypt")
			switch {
			case d == "":
				t.Errorf("%s %s: no driver recorded (%v)", sys, name, info.Drivers)
			case !noAESNI && strings.Contains(d, g):
				// The guest loads the x86 drivers (xfrmguest/build.sh) and
				// its CPU has their instructions: they, not the generic
				// ones, serve the plain rows, and the twins switch.
				t.Errorf("%s %s: the guest's kernel picked %s, the generic driver, for a plain row", sys, name, d)
			case noAESNI && !strings.Contains(d, g):
				t.Errorf("%s %s: the guest's kernel picked %s, not one on %s", sys, name, d, g)
			case noAESNI && pcrypt && !strings.Contains(d, "pcrypt("+g):
				t.Errorf("%s %s: the guest's kernel picked %s, not one on pcrypt(%s)", sys, name, d, g)
			case pcrypt != strings.Contains(d, "pcrypt("):
				t.Errorf("%s %s: the guest's kernel picked %s", sys, name, d)
			}
			t.Logf("%s %s: %s", sys, name, d)
		}
	}
	if aeads == 0 || cbcs == 0 {
		t.Fatalf("BENCHMARKS.md's command has %d AEAD and %d CBC suites: it needs each", aeads, cbcs)
	}
	for _, s := range rep.Systems {
		if s.Skipped != "" || len(s.Failed) > 0 {
			t.Errorf("%s: skipped %q, failed %v", s.Name, s.Skipped, s.Failed)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "tables.md"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "| kernel XFRM, pcrypt, no AES-NI (generic drivers) | aes128gcm16 |"; !bytes.Contains(md, []byte(want)) {
		t.Errorf("tables.md lacks %q:\n%s", want, md)
	}
}
