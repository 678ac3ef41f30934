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
	"github.com/espd/espd/testbed"
)

// TestScaleSmoke runs "go run ./bench -tunnels 4 -streams 2 -systems espd"
// in process, briefly: espd keyed with four state pairs and policy pairs,
// two TCP streams through each tunnel and the reorder probe alongside. It
// checks that every tunnel's states counted packets both ways of the
// measured direction, that every tunnel carried goodput and probe
// datagrams, and that the reorder count is reported in the JSON and the
// tables.
func TestScaleSmoke(t *testing.T) {
	if err := testbed.Available(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the harness builds espd with the go command")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"-tunnels", "4", "-streams", "2", "-systems", "espd", "-duration", "1s", "-reps", "1", "-out", out}
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("bench %s: %v\nstderr:\n%s\nstdout:\n%s", strings.Join(args, " "), err, stderr.String(), stdout.String())
	}
	t.Logf("stdout:\n%s", stdout.String())

	rep, err := report.ReadJSON(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.ScalePoints) != 1 || rep.ScalePoints[0] != (report.ScalePoint{Tunnels: 4, Streams: 2}) {
		t.Errorf("scale points %v", rep.ScalePoints)
	}
	if len(rep.Runs) != 1 {
		t.Fatalf("%d runs, want 1", len(rep.Runs))
	}
	r := rep.Runs[0]
	if !r.OK() || r.System != "espd" || r.Kind != report.KindScale || r.Suite != "aes128gcm16" || r.BitsPerSecond <= 0 {
		t.Fatalf("run: %+v", r)
	}
	if r.CPU == nil || r.CPU.GwA <= 0 || r.CPU.GwB <= 0 {
		t.Errorf("run without gateway CPU time: %+v", r.CPU)
	}
	sc := r.Scale
	if sc == nil || sc.Tunnels != 4 || sc.Streams != 2 || len(sc.PerTunnel) != 4 {
		t.Fatalf("scale fields: %+v", sc)
	}
	var total int64
	var probed, reord uint64
	for i, tr := range sc.PerTunnel {
		if tr.SA == nil || tr.SA.OutPackets == 0 || tr.SA.InPackets == 0 {
			t.Errorf("tunnel %d: its states counted %+v", i, tr.SA)
		}
		if tr.Bytes <= 0 || tr.ProbeReceived == 0 || tr.ProbeSent == 0 {
			t.Errorf("tunnel %d carried %d bytes and %d/%d probe datagrams", i, tr.Bytes, tr.ProbeReceived, tr.ProbeSent)
		}
		total += tr.Bytes
		probed += tr.ProbeReceived
		reord += tr.ProbeReordered
	}
	if total != r.Bytes || probed != sc.ProbeReceived || reord != sc.Reordered {
		t.Errorf("per-tunnel sums %d bytes, %d probed, %d reordered; run says %d, %d, %d",
			total, probed, reord, r.Bytes, sc.ProbeReceived, sc.Reordered)
	}
	if r.SA == nil || r.SA.OutPackets == 0 {
		t.Errorf("aggregate counters %+v", r.SA)
	}
	table := stdout.String()
	for _, want := range []string{"Many tunnels, many flows", "4 tunnels x 2 streams", "espd",
		fmt.Sprintf("%d/%d reord", sc.Reordered, sc.ProbeReceived)} {
		if !strings.Contains(table, want) {
			t.Errorf("tables lack %q", want)
		}
	}
	for _, f := range []string{"tables.md", "throughput.svg"} {
		if b, err := os.ReadFile(filepath.Join(out, f)); err != nil || !bytes.Contains(b, []byte("4 tunnels x 2 streams")) {
			t.Errorf("%s: %v, %d bytes", f, err, len(b))
		}
	}
	if left, err := filepath.Glob(filepath.Join(testbed.NetnsDir, fmt.Sprintf("%s-*-%d-*", namespacePrefix, os.Getpid()))); err != nil || len(left) > 0 {
		t.Errorf("namespaces left behind: %v %v", left, err)
	}
}
