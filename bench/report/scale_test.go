package report

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// scaleSample is a scale run: espd at three points with one reordered
// probe datagram in one run, wireguard-go unavailable at 256 tunnels,
// libipsec with a failed run.
func scaleSample() *Report {
	p1, p16, p256 := ScalePoint{1, 1}, ScalePoint{16, 1}, ScalePoint{256, 1}
	r := &Report{
		Machine: Machine{CPU: "Test CPU", Cores: 2}, Command: "go run ./bench -scale", Tool: "go", Family: "IPv4",
		Started: time.Unix(1e9, 0), Duration: "5s", Omit: "500ms", Reps: 3,
		Suites: []string{"aes128gcm16"}, MSS: []int{0}, ScalePoints: []ScalePoint{p1, p16, p256},
		Systems: []System{
			{Name: "espd", Label: "espd", PerSuite: true},
			{Name: "libipsec", Label: "strongSwan kernel-libipsec", PerSuite: true},
			{Name: "wireguard-go", Label: "wireguard-go", Cipher: "WireGuard",
				Unavailable: map[string]string{ScaleUnavailableKey("", p256): "too few inotify instances"}},
		},
	}
	add := func(sys, suite string, p ScalePoint, reord []uint64, mbits ...float64) {
		for i, m := range mbits {
			run := Run{System: sys, Suite: suite, Kind: KindScale, Rep: i + 1,
				BitsPerSecond: m * 1e6, Bytes: int64(m * 1e6 / 8 * 5), Seconds: 5,
				CPU:   &CPU{GwA: 1, GwB: 2},
				Scale: &ScaleRun{ScalePoint: p, ProbeReceived: 100, ProbeSent: 100}}
			if reord != nil {
				run.Scale.Reordered = reord[i]
			}
			r.Runs = append(r.Runs, run)
		}
	}
	add("espd", "aes128gcm16", p1, nil, 2000, 2200, 2100)
	add("espd", "aes128gcm16", p16, []uint64{0, 1, 0}, 1900, 2000, 1800)
	add("espd", "aes128gcm16", p256, nil, 1000, 1200, 1100)
	add("libipsec", "aes128gcm16", p1, nil, 800, 700)
	r.Runs = append(r.Runs, Run{System: "libipsec", Suite: "aes128gcm16", Kind: KindScale, Rep: 3,
		Scale: &ScaleRun{ScalePoint: p1}, Error: "tunnel 0: none of 40 probe datagrams arrived"})
	add("wireguard-go", "", p1, nil, 400, 500, 450)
	add("wireguard-go", "", p16, nil, 300, 300, 300)
	// A matrix run at the same MSS is no scale run.
	r.Runs = append(r.Runs, Run{System: "espd", Suite: "aes128gcm16", Kind: KindTCP, BitsPerSecond: 9e9, Bytes: 1})
	return r
}

func TestScaleTables(t *testing.T) {
	r := scaleSample()
	st, reord, probed := r.ScaleStat("espd", "aes128gcm16", ScalePoint{16, 1}, 0)
	if st.N != 3 || st.Median != 1900e6 || reord != 1 || probed != 300 || !st.HasCPU {
		t.Errorf("espd at 16 tunnels: %+v, %d/%d reordered", st, reord, probed)
	}
	if st, _, _ := r.ScaleStat("libipsec", "aes128gcm16", ScalePoint{1, 1}, 0); st.N != 2 || st.Failed != 1 || st.Median != 750e6 {
		t.Errorf("libipsec: %+v", st)
	}
	if st, _, _ := r.ScaleStat("espd", "aes128gcm16", ScalePoint{1, 8}, 0); st.N != 0 {
		t.Errorf("a point not measured: %+v", st)
	}
	ts := r.Tables()
	if len(ts) != 2 {
		t.Fatalf("%d tables, want the two scale tables", len(ts))
	}
	var buf bytes.Buffer
	for _, tb := range ts {
		tb.Text(&buf)
		tb.Markdown(&buf)
	}
	out := buf.String()
	for _, want := range []string{
		"1 tunnel x 1 stream", "16 tunnels x 1 stream", "256 tunnels x 1 stream",
		"2100 (2000-2200)", "1900 (1800-2000)", "750 (700-800) [1 failed]",
		"unavailable: too few inotify instances", "1/300 reord", "0/300 reord",
		"| espd | aes128gcm16 | 2100 (2000-2200) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tables lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "9000") {
		t.Errorf("a matrix run counted in the scale table:\n%s", out)
	}
	if !r.HasScale() {
		t.Error("HasScale false")
	}
	var svg bytes.Buffer
	if err := r.ScaleChart(&svg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(svg.String(), "<svg") || !strings.Contains(svg.String(), "256 tunnels x 1 stream") {
		t.Errorf("chart: %d bytes", svg.Len())
	}
	// The JSON round trip keeps the scale fields.
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.ScalePoints) != 3 || back.Runs[4].Scale == nil || back.Runs[4].Scale.Reordered != 1 || back.Runs[4].Scale.Tunnels != 16 {
		t.Errorf("JSON round trip: %+v", back.Runs[4])
	}
	// A report without scale runs has no scale chart.
	if err := (&Report{Suites: []string{"x"}, MSS: []int{0}, ScalePoints: []ScalePoint{{1, 1}}}).ScaleChart(&svg); err == nil {
		t.Error("ScaleChart drew a report without runs")
	}
}
