package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/espd/espd/bench/load"
	"github.com/espd/espd/bench/report"
	"github.com/espd/espd/bench/system"
	"github.com/espd/espd/crypto"
)

// Defaults of the scale mode.
const (
	defaultScalePoints  = "1x1,16x1,256x1,1x8"
	defaultScaleSystems = "espd,espd-udp,wireguard-go,libipsec"
	defaultScaleSuites  = "aes128gcm16"
	// maxStreams bounds the streams per tunnel, maxFlows the TCP
	// connections of one run.
	maxStreams = 64
	maxFlows   = 4096
)

// scaleOptions are the settings of the scale mode: many tunnels, many
// streams.
type scaleOptions struct {
	on               bool
	points           []report.ScalePoint
	pointsFlag       string
	tunnels, streams int
	probeRate        int
}

// register adds the scale mode's flags.
func (s *scaleOptions) register(fs *flag.FlagSet) {
	fs.BoolVar(&s.on, "scale", false, "measure many tunnels and many flows instead of the suite/MSS matrix: aggregate TCP goodput, gateway CPU per GB and reordering at each of -scale-points (defaults then: -systems "+defaultScaleSystems+", -suites "+defaultScaleSuites+", -mss max)")
	fs.StringVar(&s.pointsFlag, "scale-points", defaultScalePoints, "the scale mode's points, comma-separated TUNNELSxSTREAMS (streams per tunnel); implies -scale")
	fs.IntVar(&s.tunnels, "tunnels", 0, fmt.Sprintf("tunnels (site pairs, each with its own SAs and policy, or WireGuard peer; 1-%d): the scale mode at this one point; implies -scale", system.MaxTunnels))
	fs.IntVar(&s.streams, "streams", 0, fmt.Sprintf("parallel TCP streams per tunnel (1-%d): with -tunnels, or alone for one tunnel; implies -scale", maxStreams))
	fs.IntVar(&s.probeRate, "probe-rate", 4000, "reorder probe datagrams per second over all tunnels (scale mode)")
}

// finish switches the scale mode on if one of its flags was given, sets
// the defaults it changes (flags given explicitly win) and parses the
// points.
func (s *scaleOptions) finish(set map[string]bool, systems, suites, mss *string, o *options) error {
	if set["tunnels"] || set["streams"] || set["scale-points"] {
		s.on = true
	}
	if !s.on {
		return nil
	}
	for name, apply := range map[string]func(){
		"systems": func() { *systems = defaultScaleSystems },
		"suites":  func() { *suites = defaultScaleSuites },
		"mss":     func() { *mss = "max" },
	} {
		if !set[name] {
			apply()
		}
	}
	o.udp, o.ping = false, false
	if s.probeRate < 100 || s.probeRate > 1000000 {
		return fmt.Errorf("-probe-rate %d: 100 to 1000000 datagrams per second", s.probeRate)
	}
	if set["tunnels"] || set["streams"] {
		p := report.ScalePoint{Tunnels: max(s.tunnels, 1), Streams: max(s.streams, 1)}
		if set["tunnels"] && s.tunnels < 1 || set["streams"] && s.streams < 1 {
			return fmt.Errorf("-tunnels %d -streams %d: at least 1 each", s.tunnels, s.streams)
		}
		if set["scale-points"] {
			return errors.New("-tunnels and -streams name one point, -scale-points several: give one or the other")
		}
		s.points = []report.ScalePoint{p}
	} else {
		var err error
		if s.points, err = parseScalePoints(s.pointsFlag); err != nil {
			return err
		}
	}
	for _, p := range s.points {
		if err := checkScalePoint(p); err != nil {
			return err
		}
	}
	return nil
}

// parseScalePoints parses "1x1,16x1,256x1,1x8".
func parseScalePoints(list string) ([]report.ScalePoint, error) {
	var out []report.ScalePoint
	seen := map[report.ScalePoint]bool{}
	for _, f := range splitList(list) {
		t, st, ok := strings.Cut(strings.ToLower(f), "x")
		nt, err1 := strconv.Atoi(t)
		ns, err2 := strconv.Atoi(st)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("-scale-points: %q is not TUNNELSxSTREAMS (e.g. 16x1)", f)
		}
		p := report.ScalePoint{Tunnels: nt, Streams: ns}
		if seen[p] {
			return nil, fmt.Errorf("-scale-points: %s twice", f)
		}
		seen[p] = true
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errors.New("-scale-points: none given")
	}
	return out, nil
}

// checkScalePoint checks a point's bounds.
func checkScalePoint(p report.ScalePoint) error {
	switch {
	case p.Tunnels < 1 || p.Tunnels > system.MaxTunnels:
		return fmt.Errorf("%v: 1 to %d tunnels", p, system.MaxTunnels)
	case p.Streams < 1 || p.Streams > maxStreams:
		return fmt.Errorf("%v: 1 to %d streams per tunnel", p, maxStreams)
	case p.Tunnels*p.Streams > maxFlows:
		return fmt.Errorf("%v: at most %d TCP connections in all", p, maxFlows)
	}
	return nil
}

// scaleFlows returns the TCP flows of a point (tunnel by tunnel, its
// streams together) and the probe's flows (one per tunnel).
func scaleFlows(h *harness, p report.ScalePoint) (tcp, probe []load.Flow) {
	for i := range p.Tunnels {
		c, s := system.TunnelAddrs(h.o.family, i)
		probe = append(probe, load.Flow{Src: c, Dst: s})
		for range p.Streams {
			tcp = append(tcp, load.Flow{Src: c, Dst: s})
		}
	}
	return tcp, probe
}

// scalePlan returns the schedule of one scale point: as makePlan does for
// the matrix, with one TCP point per MSS.
func scalePlan(o *options, perSuite []bool) []step {
	var pts []point
	for _, m := range o.mss {
		pts = append(pts, point{report.KindScale, m})
	}
	return makePlan(len(o.suites), pts, o.reps, perSuite)
}

// measureScale runs the scale mode: point by point, each system is keyed
// for the point's tunnels (per suite, or once for systems with their own
// cipher), then the runs go suite block by suite block, interleaved across
// the systems as in the matrix.
func (h *harness) measureScale(ctx context.Context) {
	maxTunnels := 0
	for _, p := range h.o.scale.points {
		maxTunnels = max(maxTunnels, p.Tunnels)
	}
	tun := make([]system.Tunnels, len(h.systems))
	perSuite := make([]bool, len(h.systems))
	for i, s := range h.systems {
		perSuite[i] = s.PerSuite()
		if !h.live[i] || ctx.Err() != nil {
			continue
		}
		t, ok := s.(system.Tunnels)
		if !ok {
			h.infos[i].Failed[""] = "the harness keys one tunnel only for this system"
			if system.Group(s) == system.HostToHostGroup {
				h.infos[i].Failed[""] = "host to host: one association between the two hosts, no tunnels between sites"
			}
			h.live[i] = false
			fmt.Fprintf(h.stderr, "bench: %s: %s\n", s.Label(), h.infos[i].Failed[""])
			continue
		}
		if err := system.AddTunnelHosts(ctx, h.env, s.Topology(), maxTunnels); err != nil {
			h.infos[i].Failed[""] = oneLine(err)
			h.live[i] = false
			fmt.Fprintf(h.stderr, "bench: %s: tunnel addresses: %v\n", s.Label(), err)
			continue
		}
		tun[i] = t
	}
	total := 0
	for range h.o.scale.points {
		for _, st := range scalePlan(h.o, perSuite) {
			if h.live[st.sys] {
				total++
			}
		}
	}
	h.prog = newProgress(h.stderr, total)
	defer h.prog.end()
	for _, sp := range h.o.scale.points {
		if ctx.Err() != nil {
			return
		}
		keyed := make([]bool, len(h.systems))
		key := func(i int, suite crypto.Suite) {
			s := h.systems[i]
			name, what := "", s.Cipher()
			if s.PerSuite() {
				name, what = suite.String(), suite.String()
			}
			h.prog.note("bench: keying %d tunnels of %s for %s", sp.Tunnels, s.Label(), what)
			err := tun[i].KeyTunnels(ctx, suite, sp.Tunnels)
			k := report.ScaleUnavailableKey(name, sp)
			switch {
			case err == nil:
				keyed[i] = true
				recordDriver(h.infos[i], s, k)
			case system.IsUnavailable(err):
				h.infos[i].Unavailable[k] = oneLine(err)
				h.prog.note("bench: %s: %s unavailable: %v", s.Label(), k, err)
			default:
				h.infos[i].Failed[k] = oneLine(err)
				h.prog.note("bench: %s: %s failed: %v", s.Label(), k, err)
			}
		}
		for i := range h.systems {
			if h.live[i] && !perSuite[i] && ctx.Err() == nil {
				key(i, h.o.suites[0])
			}
		}
		steps := scalePlan(h.o, perSuite)
		for b, suite := range h.o.suites {
			for i := range h.systems {
				if h.live[i] && perSuite[i] && ctx.Err() == nil {
					key(i, suite)
				}
			}
			for _, st := range steps {
				if st.block != b || !h.live[st.sys] {
					continue
				}
				if ctx.Err() != nil {
					return
				}
				if !keyed[st.sys] {
					h.prog.skip(1)
					continue
				}
				h.runScaleStep(ctx, st, suite, sp, tun[st.sys])
			}
			for i, s := range h.systems {
				if keyed[i] && perSuite[i] {
					keyed[i] = false
					if err := s.Unkey(ctx); err != nil {
						h.prog.note("bench: %s: unkey: %v", s.Label(), err)
					}
				}
			}
		}
	}
}

// runScaleStep makes one scale run and records it: the streams of every
// tunnel at once, the reorder probe alongside, CPU over the window, and
// the tunnels' own counters where the system has them.
func (h *harness) runScaleStep(ctx context.Context, st step, suite crypto.Suite, sp report.ScalePoint, tun system.Tunnels) {
	s := h.systems[st.sys]
	h.seq++
	r := report.Run{System: s.Name(), Kind: report.KindScale, MSS: st.pt.mss, Rep: st.rep + 1, Block: st.block,
		Seq: h.seq, Start: time.Now(), Scale: &report.ScaleRun{ScalePoint: sp}}
	suiteName := s.Cipher()
	if s.PerSuite() {
		r.Suite = suite.String()
		suiteName = r.Suite
	}
	what := fmt.Sprintf("%s, %s, %v, MSS %s, run %d/%d", s.Label(), suiteName, sp, report.MSSName(st.pt.mss), st.rep+1, h.o.reps)
	h.prog.running(what)
	result, err := h.scaleRun(ctx, s, tun, sp, &r)
	if err != nil {
		r.Error = oneLine(err)
		result = "failed: " + r.Error
	}
	h.rep.Runs = append(h.rep.Runs, r)
	h.prog.finished(what, result)
}

// scaleRun measures one scale run into r.
func (h *harness) scaleRun(ctx context.Context, s system.System, tun system.Tunnels, sp report.ScalePoint, r *report.Run) (string, error) {
	top := s.Topology()
	flows, probeFlows := scaleFlows(h, sp)
	before, hasCounters, err := tun.TunnelCounters(ctx)
	if err != nil {
		return "", err
	}
	dropsA, errA := linkDrops(top.GwA)
	dropsB, errB := linkDrops(top.GwB)
	if err := errors.Join(errA, errB); err != nil {
		return "", fmt.Errorf("gateways' interface counters: %w", err)
	}
	probe, err := load.StartProbe(ctx, load.ProbeOptions{From: top.Client, To: top.Server, Flows: probeFlows, Rate: h.o.scale.probeRate})
	if err != nil {
		return "", err
	}
	var c0, c1 cpuSample
	profiled := func() error { return nil }
	res, err := load.Streams(ctx, load.StreamsOptions{From: top.Client, To: top.Server, Flows: flows, MSS: r.MSS,
		Omit: h.o.omit, Duration: h.o.duration, Window: func(start bool) {
			if start {
				c0 = h.sample(s)
				profiled = h.startProfile(ctx, s, runName(r.Seq, r.System, r.Suite, fmt.Sprintf("%dx%d run %d", sp.Tunnels, sp.Streams, r.Rep)))
			} else {
				c1 = h.sample(s)
			}
		}})
	if perr := profiled(); perr != nil {
		h.prog.note("bench: %s: profile: %v", s.Label(), perr)
	}
	probe.Stop(200 * time.Millisecond)
	whole := probe.Snapshot()
	if after, err := linkDrops(top.GwA); err == nil {
		r.Scale.GwADrops = dropsDelta(dropsA, after)
	}
	if after, err := linkDrops(top.GwB); err == nil {
		r.Scale.GwBDrops = dropsDelta(dropsB, after)
	}
	r.BitsPerSecond, r.Bytes, r.Seconds = res.Bitrate(), res.Bytes, res.Elapsed.Seconds()
	r.Retransmits, r.MSSSeen = res.Retransmits, res.MSS
	r.Scale.ReordSeen, r.Scale.IdleStreams = res.ReordSeen, res.Idle
	if err != nil {
		return "", err
	}
	r.CPU = cpuDelta(c0, c1, true)
	r.Scale.PerTunnel = make([]report.TunnelRun, sp.Tunnels)
	var errs []error
	for i := range sp.Tunnels {
		t := &r.Scale.PerTunnel[i]
		for j := range sp.Streams {
			t.Bytes += res.PerFlow[i*sp.Streams+j]
		}
		// The probe over the whole run, warm-up and tail included: one
		// reordered datagram anywhere counts.
		t.ProbeSent, t.ProbeReceived, t.ProbeReordered = whole[i].Sent, whole[i].Received, whole[i].Reordered
		r.Scale.ProbeSent += t.ProbeSent
		r.Scale.ProbeReceived += t.ProbeReceived
		r.Scale.Reordered += t.ProbeReordered
		if whole[i].Received == 0 && len(errs) == 0 {
			errs = append(errs, fmt.Errorf("tunnel %d: none of %d probe datagrams arrived", i, whole[i].Sent))
		}
	}
	if bad := probe.Malformed(); bad > 0 {
		errs = append(errs, fmt.Errorf("the probe's receiver got %d datagrams that are not its own", bad))
	}
	if hasCounters {
		after, _, err := tun.TunnelCounters(ctx)
		if err != nil {
			return "", err
		}
		if len(after) != sp.Tunnels || len(before) != sp.Tunnels {
			return "", fmt.Errorf("%d tunnels' counters before and %d after, want %d", len(before), len(after), sp.Tunnels)
		}
		r.SA = &report.SACounters{}
		idle := 0
		for i := range after {
			c := &report.SACounters{OutPackets: after[i].OutPackets - before[i].OutPackets,
				InPackets: after[i].InPackets - before[i].InPackets, InDrops: after[i].InDrops - before[i].InDrops}
			r.Scale.PerTunnel[i].SA = c
			r.SA.OutPackets += c.OutPackets
			r.SA.InPackets += c.InPackets
			r.SA.InDrops += c.InDrops
			if c.OutPackets == 0 || c.InPackets == 0 {
				if idle == 0 {
					errs = append(errs, fmt.Errorf("tunnel %d's states counted %d packets out and %d in: its traffic did not go through them",
						i, c.OutPackets, c.InPackets))
				}
				idle++
			}
		}
	}
	result := fmt.Sprintf("%.0f Mbit/s, %d retransmits, %d/%d probe datagrams reordered", res.Bitrate()/1e6,
		res.Retransmits, r.Scale.Reordered, r.Scale.ProbeReceived)
	if d := dropsSummary(r.Scale.GwADrops, r.Scale.GwBDrops); d != "" {
		result += ", interface drops: " + d
	}
	return result, errors.Join(errs...)
}
