package report

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		in := append([]float64(nil), c.in...)
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
		for i := range in {
			if in[i] != c.in[i] {
				t.Errorf("Median reordered its input: %v", c.in)
			}
		}
	}
}

// sample is a report of a small run: routing and wireguard-go (own
// cipher), espd and libipsec at two suites, XFRM unavailable, the charon
// plugin skipped, one failed run.
func sample() *Report {
	r := &Report{
		Machine: Machine{CPU: "Test CPU", Cores: 2, Kernel: "6.18", Go: "go1.26", CPUFlags: []string{"aes"}},
		Command: "go run ./bench", Tool: "go", Family: "IPv4", Started: time.Unix(1e9, 0),
		Duration: "5s", Omit: "500ms", Reps: 3, Suites: []string{"aes128gcm16", "chacha20poly1305"},
		MSS: []int{0, 200}, UDP: true, Ping: true,
		Systems: []System{
			{Name: "routing", Label: "routing only (ceiling)", Cipher: "none"},
			{Name: "espd", Label: "espd", PerSuite: true},
			{Name: "xfrm", Label: "kernel XFRM", PerSuite: true, Unavailable: map[string]string{
				"aes128gcm16": "kernel has no ESP", "chacha20poly1305": "kernel has no ESP"}},
			{Name: "libipsec", Label: "strongSwan kernel-libipsec", PerSuite: true},
			{Name: "espd-charon", Label: "espd keyed by charon", PerSuite: true, Skipped: "plugin not installed"},
			{Name: "wireguard-go", Label: "wireguard-go", Cipher: "WireGuard"},
		},
	}
	add := func(sys, suite string, mss int, mbits ...float64) {
		for i, m := range mbits {
			run := Run{System: sys, Suite: suite, Kind: KindTCP, MSS: mss, Rep: i + 1,
				BitsPerSecond: m * 1e6, Bytes: int64(m * 1e6 / 8 * 5), Seconds: 5, Retransmits: uint32(10 * (i + 1)),
				CPU: &CPU{GwA: 1, GwB: 2, HostBusy: 8, HostSoftirq: 0.5}}
			if sys == "routing" {
				run.CPU.GwA, run.CPU.GwB = 0, 0
			}
			r.Runs = append(r.Runs, run)
		}
	}
	add("routing", "", 0, 10000, 12000, 11000)
	add("routing", "", 200, 9000, 9000, 9000)
	add("wireguard-go", "", 0, 1000, 1300, 1200)
	add("wireguard-go", "", 200, 100, 100, 100)
	for _, s := range r.Suites {
		add("espd", s, 0, 2400, 2500, 2600)
		add("espd", s, 200, 300, 320, 310)
		add("libipsec", s, 0, 300, 290, 310)
		add("libipsec", s, 200, 30, 40)
		r.Runs = append(r.Runs, Run{System: "libipsec", Suite: s, Kind: KindTCP, MSS: 200, Rep: 3, Error: "connect: timeout"})
		for _, sys := range []string{"espd", "libipsec", "wireguard-go", "routing"} {
			r.Runs = append(r.Runs,
				Run{System: sys, Suite: s, Kind: KindUDP, PacketsPerSecond: 100e3, Received: 200e3, PayloadSize: 64,
					CPU: &CPU{GwA: 0.5, GwB: 0.25}},
				Run{System: sys, Suite: s, Kind: KindPing, RTTAvgUs: 60})
		}
	}
	return r
}

func TestStat(t *testing.T) {
	r := sample()
	st := r.Stat(Key{System: "espd", Suite: "aes128gcm16", Kind: KindTCP, MSS: 0})
	if st.N != 3 || st.Median != 2500e6 || st.Min != 2400e6 || st.Max != 2600e6 || st.Retransmits != 20 {
		t.Errorf("espd: %+v", st)
	}
	// 1 s of gwA CPU for 2400e6/8*5 bytes = 1.5 GB and so on: the
	// median of the per-run figures.
	if want := 1 / (2500e6 / 8 * 5 / 1e9); !st.HasCPU || abs(st.CPUA-want) > 1e-9 || abs(st.CPUB-2*want) > 1e-9 {
		t.Errorf("espd CPU per GB: %v %v, want %v %v", st.CPUA, st.CPUB, want, 2*want)
	}
	st = r.Stat(Key{System: "libipsec", Suite: "chacha20poly1305", Kind: KindTCP, MSS: 200})
	if st.N != 2 || st.Failed != 1 || st.Median != 35e6 || st.LastError != "connect: timeout" {
		t.Errorf("libipsec with a failed run: %+v", st)
	}
	// Systems with their own cipher ignore the suite asked for.
	if st := r.Stat(Key{System: "wireguard-go", Suite: "aes128gcm16", Kind: KindTCP}); st.N != 3 || st.Median != 1200e6 {
		t.Errorf("wireguard-go: %+v", st)
	}
	if st := r.Stat(Key{System: "espd", Suite: "aes256gcm16", Kind: KindTCP}); st.N != 0 {
		t.Errorf("espd at a suite not run: %+v", st)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func TestTables(t *testing.T) {
	r := sample()
	var b bytes.Buffer
	for _, tb := range r.Tables() {
		tb.Text(&b)
	}
	text := b.String()
	for _, want := range []string{
		`routing only \(ceiling\)  +none`,
		"11000 (10000-12000)",
		"wireguard-go +WireGuard",
		"2500 (2400-2600)",
		"35 (30-40) [1 failed]",
		"unavailable: kernel has no ESP",
		"skipped: plugin not installed",
		"espd vs wireguard-go",
		"2.08x", // 2500 / 1200
		"8.33x", // 2500 / 300
		"0.23x", // 2500 / 11000
		"UDP 64 B, kpps received",
		"ping RTT avg, µs",
	} {
		if !regexp.MustCompile(regexp.QuoteMeta(want)).MatchString(text) && !regexp.MustCompile(want).MatchString(text) {
			t.Errorf("tables lack %q:\n%s", want, text)
		}
	}
	// The throughput table has one row per system that ran, per suite.
	tp := r.Throughput()
	rows := map[string]int{}
	for _, row := range tp.Rows {
		rows[row[0]]++
	}
	if rows["espd"] != 2 || rows["kernel XFRM"] != 2 || rows["espd keyed by charon"] != 1 || rows["routing only (ceiling)"] != 1 {
		t.Errorf("rows: %v", rows)
	}
	b.Reset()
	tp.Markdown(&b)
	md := b.String()
	if !strings.Contains(md, "| system | suite | MSS max | MSS 200 |\n|---|---|---:|---:|\n") ||
		!strings.Contains(md, "| kernel XFRM | aes128gcm16 | unavailable: kernel has no ESP |  |") {
		t.Errorf("Markdown:\n%s", md)
	}
}

func TestChartAndJSON(t *testing.T) {
	r := sample()
	var b bytes.Buffer
	if err := r.Chart(&b); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	for _, want := range []string{"<svg", "MSS max", "MSS 200", "routing only, the ceiling: 11.0 Gbit/s", "espd", "wireguard-go (WireGuard)", "chacha20poly1305"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
	if strings.Contains(svg, "espd keyed by charon") {
		t.Error("chart has a bar for a skipped system")
	}
	path := filepath.Join(t.TempDir(), "r.json")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.WriteJSON(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	back, err := ReadJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Runs) != len(r.Runs) || back.Systems[2].Unavailable["aes128gcm16"] != "kernel has no ESP" ||
		back.Stat(Key{System: "espd", Suite: "aes128gcm16", Kind: KindTCP}).Median != 2500e6 {
		t.Errorf("JSON round trip lost data: %d runs", len(back.Runs))
	}
	if err := (&Report{}).Chart(&b); err == nil {
		t.Error("Chart of an empty report succeeded")
	}
}

// TestEmulated checks that an emulated run says so in its header, in
// every table's title and in the chart, survives the JSON, and has no
// table of speed ratios.
func TestEmulated(t *testing.T) {
	r := sample()
	r.Emulated = "emulated correctness run (qemu TCG, 1 vCPU: says nothing about speed)"
	if h := r.Header(); !strings.HasPrefix(h[0], "Emulated correctness run (qemu TCG, 1 vCPU: says nothing about speed): ") {
		t.Errorf("header: %q", h)
	}
	ts := r.Tables()
	if len(ts) == 0 {
		t.Fatal("no tables")
	}
	for _, tb := range ts {
		if !strings.HasPrefix(tb.Title, "Emulated correctness run (qemu TCG, 1 vCPU: says nothing about speed). ") || strings.Contains(tb.Title, "Ratios") {
			t.Errorf("table title %q", tb.Title)
		}
	}
	var b bytes.Buffer
	if err := r.Chart(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "says nothing about speed") {
		t.Error("the chart does not say it is emulated")
	}
	b.Reset()
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	back, err := ParseJSON(b.Bytes())
	if err != nil || back.Emulated != r.Emulated {
		t.Errorf("JSON round trip: %q, %v", back.Emulated, err)
	}
	if r.Emulated = ""; len(r.Tables()) != len(ts)+1 || strings.Contains(r.Header()[0], "Emulated") {
		t.Error("a run that is not emulated is labelled, or lost its ratios")
	}
}

// TestHopTable: the hop table appears only with hops, one row per system
// and suite that has them, each cell the median over its runs.
func TestHopTable(t *testing.T) {
	r := sample()
	if h := r.HopTable(); len(h.Rows) != 0 {
		t.Fatalf("hop table without hops: %v", h.Rows)
	}
	for _, v := range []float64{100, 300, 200} {
		r.Runs = append(r.Runs, Run{System: "espd", Suite: "aes128gcm16", Kind: KindPing, RTTAvgUs: 4 * v,
			Hops: &Hops{AOutUs: v, BInUs: v + 1, ServerUs: 30, BOutUs: v + 2, AInUs: v + 3, WireUs: 4, ClientUs: 50, Followed: 20}})
	}
	r.Runs = append(r.Runs, Run{System: "espd", Suite: "aes128gcm16", Kind: KindPing, Error: "timeout",
		Hops: &Hops{AOutUs: 9999}})
	h := r.HopTable()
	if len(h.Rows) != 1 {
		t.Fatalf("hop table rows %v, want espd aes128gcm16 only", h.Rows)
	}
	want := []string{"espd", "aes128gcm16", "800", "200", "201", "30", "202", "203", "4", "50", "20"}
	if !slices.Equal(h.Rows[0], want) {
		t.Errorf("hop row %q, want %q", h.Rows[0], want)
	}
	found := false
	for _, tb := range r.Tables() {
		found = found || strings.HasPrefix(tb.Title, "Where the ping's round trip goes")
	}
	if !found {
		t.Errorf("Tables() lacks the hop table")
	}
}

// TestRatiosXDP: the default ratios put espd's AF_XDP receive (with and
// without AES-NI) as the subject against raw ESP over the raw socket,
// ESP-in-UDP and, without AES-NI, wireguard-go.
func TestRatiosXDP(t *testing.T) {
	r := &Report{Suites: []string{"aes128gcm16"}, MSS: []int{0}}
	for _, s := range []struct {
		name, label string
		mbits       float64
	}{
		{"espd", "espd", 2000},
		{"espd-noaesni", "espd, no AES-NI/AVX2", 500},
		{"espd-xdp", "espd, raw ESP, AF_XDP receive", 3200},
		{"espd-xdp-noaesni", "espd, raw ESP, AF_XDP receive, no AES-NI/AVX2", 800},
		{"espd-udp", "espd, ESP-in-UDP", 1600},
		{"espd-udp-noaesni", "espd, ESP-in-UDP, no AES-NI/AVX2", 400},
		{"wireguard-go-noaesni", "wireguard-go, no AES-NI/AVX2", 200},
	} {
		sys := System{Name: s.name, Label: s.label, PerSuite: true}
		suite := "aes128gcm16"
		if strings.HasPrefix(s.name, "wireguard-go") {
			sys.PerSuite, sys.Cipher, suite = false, "WireGuard", ""
		}
		r.Systems = append(r.Systems, sys)
		r.Runs = append(r.Runs, Run{System: s.name, Suite: suite, Kind: KindTCP, Rep: 1, BitsPerSecond: s.mbits * 1e6, Seconds: 5})
	}
	rows := map[string]string{}
	for _, row := range r.Ratios(DefaultRatios).Rows {
		rows[row[0]] = row[2]
	}
	for pair, want := range map[string]string{
		"espd, raw ESP, AF_XDP receive vs espd, ESP-in-UDP":                                 "2.00x",
		"espd, raw ESP, AF_XDP receive vs espd":                                             "1.60x",
		"espd, raw ESP, AF_XDP receive, no AES-NI/AVX2 vs espd, ESP-in-UDP, no AES-NI/AVX2": "2.00x",
		"espd, raw ESP, AF_XDP receive, no AES-NI/AVX2 vs espd, no AES-NI/AVX2":             "1.60x",
		"espd, raw ESP, AF_XDP receive, no AES-NI/AVX2 vs wireguard-go, no AES-NI/AVX2":     "4.00x",
		"espd, ESP-in-UDP vs espd":                                                          "0.80x",
		"espd, no AES-NI/AVX2 vs wireguard-go, no AES-NI/AVX2":                              "2.50x",
	} {
		if rows[pair] != want {
			t.Errorf("ratio %q = %q, want %q (rows %v)", pair, rows[pair], want, rows)
		}
	}
	for pair := range rows {
		if strings.Contains(pair, "vs espd, raw ESP, AF_XDP") {
			t.Errorf("espd-xdp is a peer in %q, want it the subject", pair)
		}
	}
}

// TestHostToHostGroup: the host-to-host systems' rows follow every
// gateway row, their ceiling first and then suite by suite; the tables
// say where they were measured; the chart draws their ceiling in the
// panels' titles and their tunnels as bars after the gateways'; the
// default ratios compare them with the hosts in the clear and with espd
// between the LANs.
func TestHostToHostGroup(t *testing.T) {
	r := sample()
	const g = "host to host, transport mode"
	r.Systems = append(r.Systems,
		System{Name: "hosts-plain", Label: g + ": no IPsec (ceiling)", Cipher: "none", Group: g},
		System{Name: "espd-transport", Label: g + ": espd", PerSuite: true, Group: g},
		System{Name: "xfrm-transport", Label: g + ": kernel XFRM", PerSuite: true, Group: g, Unavailable: map[string]string{
			"aes128gcm16": "kernel has no ESP", "chacha20poly1305": "kernel has no ESP"}},
	)
	for i, m := range []float64{20000, 22000, 21000} {
		r.Runs = append(r.Runs, Run{System: "hosts-plain", Kind: KindTCP, Rep: i + 1, BitsPerSecond: m * 1e6, Bytes: 1e9, Seconds: 5})
	}
	for _, s := range r.Suites {
		for i, m := range []float64{1200, 1250, 1300} {
			r.Runs = append(r.Runs, Run{System: "espd-transport", Suite: s, Kind: KindTCP, Rep: i + 1, BitsPerSecond: m * 1e6, Bytes: 1e9, Seconds: 5,
				CPU: &CPU{GwA: 1, GwB: 1}})
		}
	}
	tp := r.Throughput()
	var labels []string
	for _, row := range tp.Rows {
		labels = append(labels, row[0]+" | "+row[1])
	}
	firstHost := slices.IndexFunc(labels, func(l string) bool { return strings.HasPrefix(l, g) })
	if firstHost < 0 || labels[firstHost] != g+": no IPsec (ceiling) | none" {
		t.Fatalf("rows %q: the host-to-host group does not start with its ceiling", labels)
	}
	for i, l := range labels {
		if strings.HasPrefix(l, g) != (i >= firstHost) {
			t.Errorf("row %d %q: the groups are mixed: %q", i, l, labels)
		}
	}
	if want := []string{g + ": espd | aes128gcm16", g + ": kernel XFRM | aes128gcm16", g + ": espd | chacha20poly1305"}; !slices.Equal(labels[firstHost+1:firstHost+4], want) {
		t.Errorf("host-to-host rows %q, want %q first", labels[firstHost+1:], want)
	}
	if len(tp.Notes) != 1 || !strings.Contains(tp.Notes[0], "gwA -> gwB") || !strings.Contains(tp.Notes[0], g) {
		t.Errorf("throughput notes %q", tp.Notes)
	}
	var b bytes.Buffer
	for _, tb := range r.Tables() {
		tb.Text(&b)
	}
	for _, want := range []string{
		g + `: espd vs no IPsec \(ceiling\) +aes128gcm16 +0\.06x`, // 1250 / 21000
		g + `: espd vs espd +aes128gcm16 +0\.50x`,                 // 1250 / 2500
		g + `: kernel XFRM +aes128gcm16 +unavailable: kernel has no ESP`,
	} {
		if !regexp.MustCompile(want).MatchString(b.String()) {
			t.Errorf("tables lack %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := r.Chart(&b); err != nil {
		t.Fatal(err)
	}
	if svg := b.String(); !strings.Contains(svg, "host to host in the clear: 21.0 Gbit/s") || !strings.Contains(svg, g+": espd") ||
		strings.Contains(svg, g+": no IPsec") {
		t.Errorf("chart: no host-to-host ceiling in the titles, or a bar for it")
	}
	sys := r.chartSystems()
	if len(sys) == 0 || sys[len(sys)-1].Name != "espd-transport" {
		t.Errorf("chart bars %v: want espd-transport's last", sys)
	}
	// A report of gateway systems only has no such note.
	if n := sample().Throughput().Notes; len(n) != 0 {
		t.Errorf("gateway-only notes %q", n)
	}
}
