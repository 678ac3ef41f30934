package report

import (
	"fmt"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// KindScale is a many-tunnel, many-stream TCP run: the aggregate goodput
// of Tunnels x Streams connections, with a reorder probe per tunnel.
const KindScale = "scale"

// ScalePoint is one configuration of the scale measurement: this many
// tunnels, each carrying this many TCP streams.
type ScalePoint struct {
	Tunnels int `json:"tunnels"`
	Streams int `json:"streams"`
}

// String names the point in table headings ("16 tunnels x 1 stream").
func (p ScalePoint) String() string {
	t, s := "tunnels", "streams"
	if p.Tunnels == 1 {
		t = "tunnel"
	}
	if p.Streams == 1 {
		s = "stream"
	}
	return fmt.Sprintf("%d %s x %d %s", p.Tunnels, t, p.Streams, s)
}

// ScaleUnavailableKey is the key of System.Unavailable that says why a
// system cannot carry scale point p with suite ("" for systems with their
// own cipher).
func ScaleUnavailableKey(suite string, p ScalePoint) string {
	if suite == "" {
		return p.String()
	}
	return suite + ", " + p.String()
}

// scaleTables are the tables of a scale run.
func (r *Report) scaleTables() []Table {
	return []Table{r.ScaleThroughput(), r.ScaleCost()}
}

// TunnelRun is one tunnel's share of a scale run.
type TunnelRun struct {
	// Bytes is the goodput of the tunnel's streams in the window.
	Bytes int64 `json:"bytes"`
	// ProbeSent, ProbeReceived and ProbeReordered count the tunnel's
	// reorder-probe datagrams over the whole run (warm-up, window and a
	// short tail for those in flight).
	ProbeSent      uint64 `json:"probe_sent"`
	ProbeReceived  uint64 `json:"probe_received"`
	ProbeReordered uint64 `json:"probe_reordered"`
	// SA is the tunnel's state counters client -> server, if the
	// harness reads the system's.
	SA *SACounters `json:"sa,omitempty"`
}

// ScaleRun is what a scale run adds to Run (whose goodput, bytes, CPU and
// SA fields are the aggregate over all tunnels).
type ScaleRun struct {
	ScalePoint
	// Reordered sums the tunnels' reordered probe datagrams: each probe
	// datagram carries a sequence number of its tunnel, and one that
	// arrives after a later one of the same tunnel is reordered.
	// Reordered, ProbeSent and ProbeReceived count the whole run, as
	// TunnelRun's do.
	Reordered     uint64 `json:"reordered"`
	ProbeSent     uint64 `json:"probe_sent"`
	ProbeReceived uint64 `json:"probe_received"`
	// ReordSeen sums the TCP senders' tcpi_reord_seen growth (the
	// senders' inference from SACKs; losses can look like it).
	ReordSeen uint32 `json:"reord_seen"`
	// IdleStreams counts the streams that moved nothing in the window
	// (starved; each moved something in the run, or the run failed).
	IdleStreams int `json:"idle_streams"`
	// GwADrops and GwBDrops: the packets the gateway's interfaces
	// dropped over the whole run, by interface name (tx_dropped plus
	// rx_dropped; only those that moved): a TUN's tx_dropped counts what
	// the kernel routed into it while its transmit queue was full.
	GwADrops  map[string]uint64 `json:"gw_a_drops,omitempty"`
	GwBDrops  map[string]uint64 `json:"gw_b_drops,omitempty"`
	PerTunnel []TunnelRun       `json:"per_tunnel,omitempty"`
}

// scaleRuns returns a copy of the report holding only the scale runs at
// point p.
func (r *Report) scaleRuns(p ScalePoint) *Report {
	sub := *r
	sub.Runs = nil
	for _, run := range r.Runs {
		if run.Kind == KindScale && run.Scale != nil && run.Scale.ScalePoint == p {
			sub.Runs = append(sub.Runs, run)
		}
	}
	return &sub
}

// ScaleStat summarizes a system's scale runs at point p and MSS mss;
// Reordered and ProbeReceived are sums over its successful runs (not
// medians: one reordered datagram in any run shows).
func (r *Report) ScaleStat(system, suite string, p ScalePoint, mss int) (st Stat, reordered, probed uint64) {
	sub := r.scaleRuns(p)
	var runs []Run
	for _, run := range sub.Runs {
		if run.MSS == mss {
			runs = append(runs, run)
		}
	}
	sub.Runs = runs
	st = sub.Stat(Key{System: system, Suite: suite, Kind: KindScale, MSS: mss})
	for _, run := range runs {
		if sys, ok := r.System(system); run.System != system || !run.OK() || ((!ok || sys.PerSuite) && run.Suite != suite) {
			continue
		}
		reordered += run.Scale.Reordered
		probed += run.Scale.ProbeReceived
	}
	return st, reordered, probed
}

// HasScale reports whether the report holds a successful scale run.
func (r *Report) HasScale() bool {
	for _, run := range r.Runs {
		if run.Kind == KindScale && run.OK() {
			return true
		}
	}
	return false
}

// scaleColumns are the scale tables' columns: each MSS, each point.
func (r *Report) scaleColumns() (heads []string, cols []struct {
	p   ScalePoint
	mss int
}) {
	for _, m := range r.MSS {
		for _, p := range r.ScalePoints {
			h := p.String()
			if len(r.MSS) > 1 {
				h += ", MSS " + MSSName(m)
			}
			heads = append(heads, h)
			cols = append(cols, struct {
				p   ScalePoint
				mss int
			}{p, m})
		}
	}
	return heads, cols
}

// ScaleThroughput is the scale table: one row per system and suite, one
// column per scale point, aggregate TCP goodput in Mbit/s.
func (r *Report) ScaleThroughput() Table {
	heads, cols := r.scaleColumns()
	t := Table{
		Title: fmt.Sprintf("Many tunnels, many flows: aggregate TCP goodput in Mbit/s, client -> server: median of %d run(s) (min-max)", r.Reps),
		Head:  append([]string{"system", "suite"}, heads...),
	}
	for _, rw := range r.rows() {
		cells := []string{rw.Sys.Label, rw.suiteCell()}
		if rw.Note != "" {
			t.Rows = append(t.Rows, append(cells, rw.Note))
			continue
		}
		for _, c := range cols {
			k := ScaleUnavailableKey(rw.Suite, c.p)
			if u := rw.Sys.Unavailable[k]; u != "" {
				cells = append(cells, "unavailable: "+u)
				continue
			}
			if f := rw.Sys.Failed[k]; f != "" {
				cells = append(cells, "failed: "+f)
				continue
			}
			st, _, _ := r.ScaleStat(rw.Sys.Name, rw.Suite, c.p, c.mss)
			cells = append(cells, cell(st, mbit))
		}
		t.Rows = append(t.Rows, cells)
	}
	return t
}

// ScaleCost is the scale cost table: per scale point, the gateways' CPU
// seconds per GB (gwA+gwB, medians) and the reordered probe datagrams
// out of those received (sums over the runs).
func (r *Report) ScaleCost() Table {
	heads, cols := r.scaleColumns()
	t := Table{
		Title: "Many tunnels, many flows: gateway CPU seconds per GB, gwA+gwB (medians), and reordered/received probe datagrams (all runs)",
		Head:  append([]string{"system", "suite"}, heads...),
		Notes: []string{
			"Reordered: UDP probe datagrams, numbered per tunnel and sent in bursts through the same SA as the tunnel's TCP streams, that arrived after a later one of their tunnel.",
		},
	}
	for _, rw := range r.rows() {
		if rw.Note != "" {
			continue
		}
		cells := []string{rw.Sys.Label, rw.suiteCell()}
		for _, c := range cols {
			st, reord, probed := r.ScaleStat(rw.Sys.Name, rw.Suite, c.p, c.mss)
			switch {
			case st.N == 0:
				cells = append(cells, "-")
			case !st.HasCPU || (st.CPUA == 0 && st.CPUB == 0):
				cells = append(cells, fmt.Sprintf("softirq %.2f, %d/%d reord", st.Softirq, reord, probed))
			default:
				cells = append(cells, fmt.Sprintf("%.2f+%.2f, %d/%d reord", st.CPUA, st.CPUB, reord, probed))
			}
		}
		t.Rows = append(t.Rows, cells)
	}
	return t
}

// ScaleChart draws the scale measurement as an SVG: one panel per suite
// (and MSS), one group of bars per scale point, one bar per system,
// medians in Gbit/s.
func (r *Report) ScaleChart(w io.Writer) error {
	var systems []System
	for _, s := range r.Systems {
		for _, run := range r.Runs {
			if run.System == s.Name && run.Kind == KindScale && run.OK() {
				systems = append(systems, s)
				break
			}
		}
	}
	if len(systems) == 0 || len(r.ScalePoints) == 0 || len(r.Suites) == 0 || len(r.MSS) == 0 {
		return fmt.Errorf("report: no scale runs to chart")
	}
	var names []string
	for _, p := range r.ScalePoints {
		names = append(names, p.String())
	}
	type panel struct {
		suite string
		mss   int
	}
	var panels []panel
	for _, suite := range r.Suites {
		for _, m := range r.MSS {
			panels = append(panels, panel{suite, m})
		}
	}
	const panelH = 2.6 * vg.Inch
	legendH := vg.Length(len(systems))*0.17*vg.Inch + 0.2*vg.Inch
	width := vg.Length(max(8, 1.8*float64(len(names)))) * vg.Inch
	height := panelH*vg.Length(len(panels)) + legendH
	groupW := (width - 1.2*vg.Inch) / vg.Length(len(names)) * 0.8
	barW := min(groupW/vg.Length(len(systems)), 0.4*vg.Inch)
	legend := plot.NewLegend()
	legend.Top, legend.Left = true, true
	legend.XOffs, legend.YOffs = 0.9*vg.Inch, -0.15*vg.Inch
	plots := make([][]*plot.Plot, len(panels))
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("Aggregate TCP goodput, %s, MSS %s", pn.suite, MSSName(pn.mss))
		if r.Emulated != "" {
			p.Title.Text = r.Emulated + "\n" + p.Title.Text
		}
		p.Y.Label.Text = "Gbit/s (median)"
		p.NominalX(names...)
		p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
		p.Add(plotter.NewGrid())
		top := 0.0
		for j, s := range systems {
			vals := make(plotter.Values, len(names))
			for k, sp := range r.ScalePoints {
				if st, _, _ := r.ScaleStat(s.Name, pn.suite, sp, pn.mss); st.N > 0 {
					vals[k] = st.Median / 1e9
					top = max(top, vals[k])
				}
			}
			if err := addBars(p, &legend, i == 0, s, vals, j, len(systems), barW); err != nil {
				return err
			}
		}
		p.Y.Min, p.Y.Max = 0, max(top*1.1, 0.001)
		plots[i] = []*plot.Plot{p}
	}
	c := vgsvg.New(width, height)
	dc := draw.New(c)
	legend.Draw(draw.Crop(dc, 0, 0, height-legendH, 0))
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: 0.1 * vg.Inch, PadBottom: 0.1 * vg.Inch,
		PadLeft: 0.1 * vg.Inch, PadRight: 0.2 * vg.Inch, PadY: 0.15 * vg.Inch}
	canvases := plot.Align(plots, tiles, draw.Crop(dc, 0, 0, 0, -legendH))
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	_, err := c.WriteTo(w)
	return err
}
