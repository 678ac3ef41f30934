package report

import (
	"fmt"
	"slices"
	"strings"
)

// MSSName is a column heading for an MSS ("max" for 0).
func MSSName(mss int) string {
	if mss == 0 {
		return "max"
	}
	return fmt.Sprint(mss)
}

// row is one system at one suite in the tables: Suite is empty for
// systems with their own cipher; Note, if set, replaces the numbers.
type row struct {
	Sys   System
	Suite string
	Note  string
}

func (r row) suiteCell() string {
	switch {
	case r.Sys.PerSuite:
		return r.Suite
	case r.Sys.Cipher != "":
		return r.Sys.Cipher
	}
	return "-"
}

// groups lists the systems' groups (System.Group) in report order: the
// gateways' ("") first, then the others as they first appear.
func (r *Report) groups() []string {
	gs := []string{""}
	for _, s := range r.Systems {
		if !slices.Contains(gs, s.Group) {
			gs = append(gs, s.Group)
		}
	}
	return gs
}

// rows lists the table rows group by group (groups), the gateways' first:
// in each, the systems with their own cipher first (the group's ceiling
// leading), then each suite with its systems.
func (r *Report) rows() []row {
	var out []row
	for _, g := range r.groups() {
		out = append(out, r.groupRows(g)...)
	}
	return out
}

// hostGroupNote explains the rows of the groups other than the gateways'
// in a table's notes; nil if the report has none.
func (r *Report) hostGroupNote() []string {
	var notes []string
	for _, g := range r.groups()[1:] {
		notes = append(notes, fmt.Sprintf("Rows labelled %q measure the two hosts' own traffic, gwA -> gwB's transit address, not client -> server through the gateways.", g))
	}
	return notes
}

// groupRows lists group g's rows, as rows does.
func (r *Report) groupRows(g string) []row {
	var out []row
	note := func(s System, suite string) string {
		switch {
		case s.Skipped != "":
			return "skipped: " + s.Skipped
		case s.Failed[""] != "":
			return "failed: " + s.Failed[""]
		case s.Unavailable[suite] != "":
			return "unavailable: " + s.Unavailable[suite]
		case s.Failed[suite] != "":
			return "failed: " + s.Failed[suite]
		}
		return ""
	}
	var systems []System
	for _, s := range r.Systems {
		if s.Group == g {
			systems = append(systems, s)
		}
	}
	for _, s := range systems {
		if !s.PerSuite {
			out = append(out, row{Sys: s, Note: note(s, "")})
		}
	}
	for _, s := range systems {
		if s.PerSuite && (s.Skipped != "" || s.Failed[""] != "") {
			out = append(out, row{Sys: s, Note: note(s, "")})
		}
	}
	for _, suite := range r.Suites {
		for _, s := range systems {
			if s.PerSuite && s.Skipped == "" && s.Failed[""] == "" {
				out = append(out, row{Sys: s, Suite: suite, Note: note(s, suite)})
			}
		}
	}
	return out
}

func mbit(v float64) string { return fmt.Sprintf("%.0f", v/1e6) }

// cell formats a cell's median and range, or why it has none.
func cell(st Stat, format func(float64) string) string {
	if st.N == 0 {
		if st.Failed > 0 {
			return fmt.Sprintf("failed (%d runs)", st.Failed)
		}
		return "-"
	}
	s := format(st.Median)
	if st.N > 1 {
		s += fmt.Sprintf(" (%s-%s)", format(st.Min), format(st.Max))
	}
	if st.Failed > 0 {
		s += fmt.Sprintf(" [%d failed]", st.Failed)
	}
	return s
}

func (r *Report) key(rw row, kind string, mss int) Key {
	return Key{System: rw.Sys.Name, Suite: rw.Suite, Kind: kind, MSS: mss}
}

// Throughput is the seeds' table: one row per system and suite, one column
// per MSS, TCP goodput in Mbit/s.
func (r *Report) Throughput() Table {
	t := Table{
		Title: fmt.Sprintf("TCP goodput in Mbit/s, client -> server, one stream: median of %d run(s) (min-max)", r.Reps),
		Head:  []string{"system", "suite"},
		Notes: r.hostGroupNote(),
	}
	for _, m := range r.MSS {
		t.Head = append(t.Head, "MSS "+MSSName(m))
	}
	for _, rw := range r.rows() {
		cells := []string{rw.Sys.Label, rw.suiteCell()}
		if rw.Note != "" {
			t.Rows = append(t.Rows, append(cells, rw.Note))
			continue
		}
		for _, m := range r.MSS {
			cells = append(cells, cell(r.Stat(r.key(rw, KindTCP, m)), mbit))
		}
		t.Rows = append(t.Rows, cells)
	}
	return t
}

// Cost is the CPU and retransmit table: per MSS, the gateways' CPU seconds
// per GB (gwA+gwB) and the TCP retransmits per run, medians.
func (r *Report) Cost() Table {
	t := Table{
		Title: "Cost per MSS: gateway CPU seconds per GB, gwA+gwB (kernel data paths: machine softirq s/GB), and TCP retransmits per run; medians",
		Head:  []string{"system", "suite"},
		Notes: []string{
			"CPU: utime+stime of the gateways' data-plane processes over the measured window, per 1e9 bytes of goodput.",
			"Routing and kernel XFRM have no process; their cell shows the machine's softirq time per GB instead (end hosts' receive path included).",
		},
	}
	if hn := r.hostGroupNote(); len(hn) > 0 {
		t.Notes = append(t.Notes, "Host to host, gwA and gwB are the hosts: the CPU is their data-plane processes' (espd), the TCP endpoints' own work is the generator's, as for the client and the server.")
	}
	for _, m := range r.MSS {
		t.Head = append(t.Head, "MSS "+MSSName(m))
	}
	for _, rw := range r.rows() {
		cells := []string{rw.Sys.Label, rw.suiteCell()}
		if rw.Note != "" {
			continue
		}
		for _, m := range r.MSS {
			st := r.Stat(r.key(rw, KindTCP, m))
			switch {
			case st.N == 0:
				cells = append(cells, "-")
			case !st.HasCPU:
				cells = append(cells, fmt.Sprintf("%.0f rtx", st.Retransmits))
			case st.CPUA == 0 && st.CPUB == 0:
				cells = append(cells, fmt.Sprintf("softirq %.2f, %.0f rtx", st.Softirq, st.Retransmits))
			default:
				cells = append(cells, fmt.Sprintf("%.2f+%.2f, %.0f rtx", st.CPUA, st.CPUB, st.Retransmits))
			}
		}
		t.Rows = append(t.Rows, cells)
	}
	return t
}

// Small is the small-packet and latency table: UDP datagrams per second
// (thousands) and ping round-trip time.
func (r *Report) Small() Table {
	t := Table{
		Title: "Small packets and latency: medians (min-max)",
		Head:  []string{"system", "suite"},
	}
	if r.UDP {
		t.Head = append(t.Head, "UDP 64 B, kpps received", "gw CPU s per M packets")
	}
	if r.Ping {
		t.Head = append(t.Head, "ping RTT avg, µs")
	}
	for _, rw := range r.rows() {
		if rw.Note != "" {
			continue
		}
		cells := []string{rw.Sys.Label, rw.suiteCell()}
		if r.UDP {
			st := r.Stat(r.key(rw, KindUDP, 0))
			cells = append(cells, cell(st, func(v float64) string { return fmt.Sprintf("%.0f", v/1e3) }))
			cpu := "-"
			if st.HasCPU && (st.CPUA > 0 || st.CPUB > 0) {
				// s/GB of 64-byte payloads -> s per million packets.
				perM := 64e6 / 1e9
				cpu = fmt.Sprintf("%.2f+%.2f", st.CPUA*perM, st.CPUB*perM)
			}
			cells = append(cells, cpu)
		}
		if r.Ping {
			cells = append(cells, cell(r.Stat(r.key(rw, KindPing, 0)), func(v float64) string { return fmt.Sprintf("%.0f", v) }))
		}
		t.Rows = append(t.Rows, cells)
	}
	return t
}

// HopTable is where the idle tunnel's round trip goes (-ping-hops): per
// system and suite, the median over the ping runs of each run's median
// hop, in microseconds. It has no rows without hops.
func (r *Report) HopTable() Table {
	t := Table{
		Title: "Where the ping's round trip goes: medians, µs (gateway A: the client's; out: LAN to transit link, in: transit to LAN)",
		Head:  []string{"system", "suite", "RTT", "A out", "B in", "server", "B out", "A in", "transit link", "client", "followed"},
	}
	for _, rw := range r.rows() {
		if rw.Note != "" {
			continue
		}
		var rtt, followed []float64
		var f [7][]float64
		for _, run := range r.Runs {
			if run.Kind != KindPing || run.System != rw.Sys.Name || (rw.Sys.PerSuite && run.Suite != rw.Suite) || !run.OK() || run.Hops == nil {
				continue
			}
			h := run.Hops
			rtt, followed = append(rtt, run.RTTAvgUs), append(followed, float64(h.Followed))
			for i, v := range []float64{h.AOutUs, h.BInUs, h.ServerUs, h.BOutUs, h.AInUs, h.WireUs, h.ClientUs} {
				f[i] = append(f[i], v)
			}
		}
		if len(rtt) == 0 {
			continue
		}
		cells := []string{rw.Sys.Label, rw.suiteCell(), fmt.Sprintf("%.0f", Median(rtt))}
		for i := range f {
			cells = append(cells, fmt.Sprintf("%.0f", Median(f[i])))
		}
		t.Rows = append(t.Rows, append(cells, fmt.Sprintf("%.0f", Median(followed))))
	}
	return t
}

// Ratio is one comparison: a subject system against a peer, same suite
// (or the peer's own cipher).
type Ratio struct {
	Subject, Peer string
}

// DefaultRatios are the comparisons the report prints when both systems
// ran: espd against each peer, espd's modes without AES-NI against the
// peers without it (the kernel's ESP on its generic drivers among them), ESP-in-UDP against raw ESP, raw ESP received
// through AF_XDP (espd-xdp) against both of the others, with and without
// AES-NI, and host to host: espd in transport mode against the hosts in
// the clear and the kernel's transport mode, ESP-in-UDP against raw ESP,
// and each against espd's tunnel between the LANs.
var DefaultRatios = []Ratio{
	{"espd", "wireguard-go"},
	{"espd", "libipsec"},
	{"espd", "xfrm"},
	{"espd", "espd-charon"},
	{"espd", "routing"},
	{"espd-noaesni", "wireguard-go-noaesni"},
	{"espd-udp-noaesni", "wireguard-go-noaesni"},
	{"espd-noaesni", "libipsec-noaesni"},
	{"espd-noaesni", "xfrm-noaesni"},
	{"espd-udp-noaesni", "xfrm-noaesni"},
	{"espd-noaesni", "xfrm-pcrypt-noaesni"},
	{"espd-udp", "espd"},
	{"espd-udp-noaesni", "espd-noaesni"},
	{"espd-xdp", "espd-udp"},
	{"espd-xdp-noaesni", "espd-udp-noaesni"},
	{"espd-xdp", "espd"},
	{"espd-xdp-noaesni", "espd-noaesni"},
	{"espd-xdp-noaesni", "wireguard-go-noaesni"},
	{"espd-transport", "hosts-plain"},
	{"espd-transport-udp", "hosts-plain"},
	{"xfrm-transport", "hosts-plain"},
	{"espd-transport", "xfrm-transport"},
	{"espd-transport-udp", "espd-transport"},
	{"espd-transport", "espd"},
	{"espd-transport-udp", "espd-udp"},
}

// Ratios is the table of throughput ratios of medians from this run, one
// row per suite and comparison, one column per MSS (and UDP packet rate).
func (r *Report) Ratios(pairs []Ratio) Table {
	t := Table{
		Title: "Ratios of medians in this run (subject / peer; above 1: the subject is faster)",
		Head:  []string{"subject vs peer", "suite"},
	}
	for _, m := range r.MSS {
		t.Head = append(t.Head, "MSS "+MSSName(m))
	}
	if r.UDP {
		t.Head = append(t.Head, "UDP 64 B")
	}
	ran := func(name string) (System, bool) {
		s, ok := r.System(name)
		return s, ok && s.Skipped == "" && s.Failed[""] == ""
	}
	for _, suite := range r.Suites {
		for _, p := range pairs {
			subj, ok1 := ran(p.Subject)
			peer, ok2 := ran(p.Peer)
			if !ok1 || !ok2 || subj.Unavailable[suite] != "" || peer.Unavailable[suite] != "" {
				continue
			}
			peerLabel := peer.Label
			if peer.Group != "" && peer.Group == subj.Group {
				// Said once: "host to host, transport mode: espd vs no IPsec (ceiling)".
				peerLabel = strings.TrimPrefix(peerLabel, peer.Group+": ")
			}
			cells := []string{fmt.Sprintf("%s vs %s", subj.Label, peerLabel), suite}
			any := false
			ratio := func(kind string, mss int) string {
				a := r.Stat(Key{System: subj.Name, Suite: suite, Kind: kind, MSS: mss})
				b := r.Stat(Key{System: peer.Name, Suite: suite, Kind: kind, MSS: mss})
				if a.N == 0 || b.N == 0 || b.Median == 0 {
					return "-"
				}
				any = true
				return fmt.Sprintf("%.2fx", a.Median/b.Median)
			}
			for _, m := range r.MSS {
				cells = append(cells, ratio(KindTCP, m))
			}
			if r.UDP {
				cells = append(cells, ratio(KindUDP, 0))
			}
			if any {
				t.Rows = append(t.Rows, cells)
			}
		}
	}
	return t
}

// Tables returns every table of the report, in order.
func (r *Report) Tables() []Table {
	var ts []Table
	switch {
	case len(r.ScalePoints) > 0:
		ts = r.scaleTables()
	default:
		ts = []Table{r.Throughput(), r.Cost()}
		if r.UDP || r.Ping {
			ts = append(ts, r.Small())
		}
		if h := r.HopTable(); len(h.Rows) > 0 {
			ts = append(ts, h)
		}
		// Ratios compare speeds, which an emulated run does not measure.
		if rt := r.Ratios(DefaultRatios); len(rt.Rows) > 0 && r.Emulated == "" {
			ts = append(ts, rt)
		}
	}
	if r.Emulated != "" {
		for i := range ts {
			ts[i].Title = r.emulatedLabel() + ". " + ts[i].Title
		}
	}
	return ts
}

// emulatedLabel is Emulated as the start of a sentence.
func (r *Report) emulatedLabel() string {
	return strings.ToUpper(r.Emulated[:1]) + r.Emulated[1:]
}

// Header describes the run in a few lines.
func (r *Report) Header() []string {
	m := r.Machine
	var lines []string
	if r.Emulated != "" {
		lines = append(lines, r.emulatedLabel()+": it shows that each data path keys, carries traffic and counts it, not how fast it is")
	}
	lines = append(lines,
		fmt.Sprintf("espd benchmark, %s: %s, %d cores, kernel %s, %s", r.Started.Format("2006-01-02 15:04"), m.CPU, m.Cores, m.Kernel, m.Go),
		fmt.Sprintf("command: %s", r.Command),
		fmt.Sprintf("traffic: %s, %s inner and outer, %s measured per run after %s warm-up, %d run(s) per point, interleaved across systems",
			map[string]string{"go": "built-in Go TCP generator", "iperf3": "iperf3"}[r.Tool], r.Family, r.Duration, r.Omit, r.Reps),
	)
	if m.Hypervisor != "" {
		lines = append(lines, "virtualization: "+m.Hypervisor)
	}
	if len(m.CPUFlags) > 0 {
		lines = append(lines, "CPU crypto features: "+strings.Join(m.CPUFlags, " "))
	}
	return lines
}
