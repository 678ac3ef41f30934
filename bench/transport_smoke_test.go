package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/bench/report"
	"github.com/espd/espd/bench/system"
	"github.com/espd/espd/testbed"
)

// TestTransportSmoke runs the harness for the host-to-host systems
// hosts-plain and espd-transport, briefly: espd keyed in transport mode
// between gwA and gwB, TCP and ping from gwA to gwB's transit address. It
// checks that both moved traffic, that espd's transport-mode states
// counted it (so it did not go around them), and that the report puts
// both in the host-to-host group and says so in the tables.
func TestTransportSmoke(t *testing.T) {
	if err := testbed.Available(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the harness builds espd with the go command")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"-systems", "hosts-plain,espd-transport", "-suites", "aes128gcm16", "-mss", "max", "-duration", "1s",
		"-reps", "1", "-udp=false", "-ping-count", "3", "-out", out}
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("bench %s: %v\nstderr:\n%s\nstdout:\n%s", strings.Join(args, " "), err, stderr.String(), stdout.String())
	}
	t.Logf("stdout:\n%s", stdout.String())

	rep, err := report.ReadJSON(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"hosts-plain", "espd-transport"} {
		s, ok := rep.System(name)
		if !ok || s.Group != system.HostToHostGroup || !strings.HasPrefix(s.Label, system.HostToHostGroup) || s.Skipped != "" || len(s.Failed) > 0 {
			t.Errorf("%s in the report: %+v", name, s)
		}
	}
	runs := map[string]int{}
	for _, r := range rep.Runs {
		if !r.OK() {
			t.Errorf("%s %s failed: %s", r.System, r.Kind, r.Error)
			continue
		}
		runs[r.System+" "+r.Kind]++
		switch {
		case r.Kind == report.KindTCP && r.BitsPerSecond <= 0:
			t.Errorf("%s: %v bit/s", r.System, r.BitsPerSecond)
		case r.Kind == report.KindPing && r.RTTAvgUs <= 0:
			t.Errorf("%s: ping %v µs", r.System, r.RTTAvgUs)
		}
		switch r.System {
		case "espd-transport":
			if r.SA == nil || r.SA.OutPackets == 0 || r.SA.InPackets == 0 || r.SA.InDrops != 0 {
				t.Errorf("espd-transport %s: the states counted %+v", r.Kind, r.SA)
			}
			if r.Kind == report.KindTCP && (r.CPU == nil || r.CPU.GwA <= 0 || r.CPU.GwB <= 0) {
				t.Errorf("espd-transport: no CPU time of espd on the hosts: %+v", r.CPU)
			}
		case "hosts-plain":
			if r.SA != nil {
				t.Errorf("hosts-plain has state counters: %+v", r.SA)
			}
		}
	}
	for _, cell := range []string{"hosts-plain tcp", "hosts-plain ping", "espd-transport tcp", "espd-transport ping"} {
		if runs[cell] != 1 {
			t.Errorf("%s: %d good runs, want 1 (%v)", cell, runs[cell], runs)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "tables.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| host to host, transport mode: espd | aes128gcm16 |", "gwA -> gwB", "espd vs no IPsec (ceiling)"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("tables.md lacks %q:\n%s", want, md)
		}
	}
	if svg, err := os.ReadFile(filepath.Join(out, "throughput.svg")); err != nil || !bytes.Contains(svg, []byte("host to host in the clear")) {
		t.Errorf("the chart has no host-to-host ceiling (%v)", err)
	}
	if left, _ := filepath.Glob(filepath.Join(testbed.NetnsDir, fmt.Sprintf("%s-*-%d-*", namespacePrefix, os.Getpid()))); len(left) > 0 {
		t.Errorf("namespaces left behind: %v", left)
	}
}
