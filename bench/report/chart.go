package report

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Ceilings are the systems that carry their group's traffic in the
// clear, with what a chart's panel titles call them: their goodput goes
// in each panel's title rather than in a bar.
var Ceilings = []struct{ Name, Title string }{
	{"routing", "routing only, the ceiling"},
	{"hosts-plain", "host to host in the clear"},
}

// IsCeiling reports whether the system called name is one of Ceilings.
func IsCeiling(name string) bool {
	return slices.ContainsFunc(Ceilings, func(c struct{ Name, Title string }) bool { return c.Name == name })
}

// chartSystems returns the systems drawn as bars: every tunnel with at
// least one TCP result, the gateways' first, then the other groups' (the
// ceilings, routing and hosts-plain, go in each panel's title instead).
func (r *Report) chartSystems() []System {
	var out []System
	for _, g := range r.groups() {
		out = append(out, r.chartGroup(g)...)
	}
	return out
}

// chartGroup returns chartSystems' systems of group g.
func (r *Report) chartGroup(g string) []System {
	var out []System
	for _, s := range r.Systems {
		if s.Group != g || IsCeiling(s.Name) {
			continue
		}
		for _, run := range r.Runs {
			if run.System == s.Name && run.Kind == KindTCP && run.OK() {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// Chart draws the TCP goodput as an SVG: a legend, then one panel per MSS
// with one group of bars per suite and one bar per system (systems with
// their own cipher are repeated in every group, for comparison), medians
// in Gbit/s.
func (r *Report) Chart(w io.Writer) error {
	systems := r.chartSystems()
	if len(systems) == 0 || len(r.MSS) == 0 || len(r.Suites) == 0 {
		return fmt.Errorf("report: nothing to chart")
	}
	const panelH = 2.6 * vg.Inch
	legendH := vg.Length(len(systems))*0.17*vg.Inch + 0.2*vg.Inch
	width := vg.Length(max(8, 1.6*float64(len(r.Suites)))) * vg.Inch
	height := panelH*vg.Length(len(r.MSS)) + legendH
	groupW := (width - 1.2*vg.Inch) / vg.Length(len(r.Suites)) * 0.8
	barW := min(groupW/vg.Length(len(systems)), 0.4*vg.Inch)

	legend := plot.NewLegend()
	legend.Top, legend.Left = true, true
	legend.XOffs, legend.YOffs = 0.9*vg.Inch, -0.15*vg.Inch
	plots := make([][]*plot.Plot, len(r.MSS))
	for i, mss := range r.MSS {
		p := plot.New()
		title := fmt.Sprintf("TCP goodput, MSS %s", MSSName(mss))
		var ceil []string
		for _, c := range Ceilings {
			if rt := r.Stat(Key{System: c.Name, Kind: KindTCP, MSS: mss}); rt.N > 0 {
				ceil = append(ceil, fmt.Sprintf("%s: %.1f Gbit/s", c.Title, rt.Median/1e9))
			}
		}
		if len(ceil) > 0 {
			title += " (" + strings.Join(ceil, "; ") + ")"
		}
		if r.Emulated != "" {
			title = r.Emulated + "\n" + title
		}
		p.Title.Text = title
		p.Y.Label.Text = "Gbit/s (median)"
		p.NominalX(r.Suites...)
		p.X.Min, p.X.Max = -0.5, float64(len(r.Suites))-0.5
		p.Add(plotter.NewGrid())
		top := 0.0
		for j, s := range systems {
			vals := make(plotter.Values, len(r.Suites))
			for k, suite := range r.Suites {
				if st := r.Stat(Key{System: s.Name, Suite: suite, Kind: KindTCP, MSS: mss}); st.N > 0 {
					vals[k] = st.Median / 1e9
					top = max(top, vals[k])
				}
			}
			if err := addBars(p, &legend, i == 0, s, vals, j, len(systems), barW); err != nil {
				return err
			}
		}
		p.Y.Min, p.Y.Max = 0, top*1.1
		plots[i] = []*plot.Plot{p}
	}
	c := vgsvg.New(width, height)
	dc := draw.New(c)
	legend.Draw(draw.Crop(dc, 0, 0, height-legendH, 0))
	tiles := draw.Tiles{Rows: len(r.MSS), Cols: 1, PadTop: 0.1 * vg.Inch, PadBottom: 0.1 * vg.Inch,
		PadLeft: 0.1 * vg.Inch, PadRight: 0.2 * vg.Inch, PadY: 0.15 * vg.Inch}
	canvases := plot.Align(plots, tiles, draw.Crop(dc, 0, 0, 0, -legendH))
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	_, err := c.WriteTo(w)
	return err
}

// addBars adds system s's bars (vals, one per group) to panel p as the j-th
// of n systems, barW wide, and names the system in the legend if named.
func addBars(p *plot.Plot, legend *plot.Legend, named bool, s System, vals plotter.Values, j, n int, barW vg.Length) error {
	bars, err := plotter.NewBarChart(vals, barW)
	if err != nil {
		return err
	}
	bars.Color = plotutil.Color(j)
	bars.LineStyle.Width = 0
	bars.Offset = barW*vg.Length(j) - barW*vg.Length(n-1)/2
	p.Add(bars)
	if named {
		label := s.Label
		if !s.PerSuite && s.Cipher != "" {
			label += " (" + s.Cipher + ")"
		}
		legend.Add(label, bars)
	}
	return nil
}
