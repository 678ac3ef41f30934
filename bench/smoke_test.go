package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/bench/report"
	"github.com/espd/espd/testbed"
)

// TestQuickSmoke runs "go run ./bench -quick" in process: it builds espd,
// keys it through its control socket, pushes TCP through it and through
// plain routing, and writes the table, the JSON and the chart. It checks
// that espd moved traffic (goodput above zero and its states' counters
// above zero), that routing did too, and that every output exists and
// holds what it should.
func TestQuickSmoke(t *testing.T) {
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
	prof := filepath.Join(out, "profiles")
	if err := run(ctx, []string{"-quick", "-out", out, "-profile", prof}, &stdout, &stderr); err != nil {
		t.Fatalf("bench -quick: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), stdout.String())
	}
	t.Logf("stdout:\n%s", stdout.String())

	rep, err := report.ReadJSON(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Suites) != 1 || rep.Suites[0] != "aes128gcm16" || len(rep.MSS) != 1 || rep.MSS[0] != 0 {
		t.Errorf("quick run measured suites %v, MSS %v", rep.Suites, rep.MSS)
	}
	var espd, routing int
	for _, r := range rep.Runs {
		if !r.OK() {
			t.Errorf("run %+v failed: %s", r, r.Error)
			continue
		}
		switch r.System {
		case "espd":
			espd++
			if r.Kind != report.KindTCP || r.Suite != "aes128gcm16" || r.BitsPerSecond <= 0 || r.Bytes <= 0 {
				t.Errorf("espd run: %+v", r)
			}
			if r.SA == nil || r.SA.OutPackets == 0 || r.SA.InPackets == 0 {
				t.Errorf("espd's states counted no packets: %+v", r.SA)
			}
			if r.CPU == nil || r.CPU.GwA <= 0 || r.CPU.GwB <= 0 || r.CPU.HostBusy <= 0 {
				t.Errorf("espd run without gateway CPU time: %+v", r.CPU)
			}
			if r.MSSSeen == 0 || r.MSSSeen > 1400 {
				t.Errorf("espd run: MSS %d through a 1400-byte TUN", r.MSSSeen)
			}
		case "routing":
			routing++
			if r.BitsPerSecond <= 0 || r.SA != nil {
				t.Errorf("routing run: %+v", r)
			}
		default:
			t.Errorf("quick run measured %s", r.System)
		}
	}
	if espd != 1 || routing != 1 {
		t.Errorf("%d espd and %d routing runs, want 1 and 1", espd, routing)
	}
	if st := rep.Stat(report.Key{System: "espd", Suite: "aes128gcm16", Kind: report.KindTCP}); st.N != 1 || st.Median <= 0 {
		t.Errorf("espd cell: %+v", st)
	}

	table := stdout.String()
	for _, want := range []string{"TCP goodput in Mbit/s", "routing only (ceiling)", "espd", "aes128gcm16", "MSS max", "Ratios of medians"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "tables.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(md, []byte("| espd | aes128gcm16 |")) || !bytes.Contains(md, []byte("|---|---|---:|")) {
		t.Errorf("Markdown tables:\n%s", md)
	}
	svg, err := os.ReadFile(filepath.Join(out, "throughput.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("espd")) {
		t.Errorf("chart is not an SVG naming espd (%d bytes)", len(svg))
	}
	// -profile: one CPU profile per espd gateway of the espd run (none
	// for routing), gzip'd pprof protobufs of CPU samples.
	profiles, _ := filepath.Glob(filepath.Join(prof, "*.pprof"))
	if len(profiles) != 2 {
		t.Errorf("profiles %q, want gwA's and gwB's of the espd run", profiles)
	}
	for _, p := range profiles {
		if !strings.Contains(p, "espd") {
			t.Errorf("profile %s is not of an espd run", p)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Errorf("profile %s: %v", p, err)
			f.Close()
			continue
		}
		b, err := io.ReadAll(zr)
		f.Close()
		if err != nil || !bytes.Contains(b, []byte("samples")) || !bytes.Contains(b, []byte("cpu")) {
			t.Errorf("profile %s is no CPU profile (%d bytes, %v)", p, len(b), err)
		}
	}
	// Nothing is left behind.
	// Only this process's: namespace names carry the pid, and another
	// harness may be running on the machine.
	if left, err := filepath.Glob(filepath.Join(testbed.NetnsDir, fmt.Sprintf("%s-*-%d-*", namespacePrefix, os.Getpid()))); err != nil || len(left) > 0 {
		t.Errorf("namespaces left behind: %v %v", left, err)
	}
}
