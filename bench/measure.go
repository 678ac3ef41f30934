package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/espd/espd/bench/load"
	"github.com/espd/espd/bench/procstat"
	"github.com/espd/espd/bench/report"
	"github.com/espd/espd/bench/system"
	"github.com/espd/espd/crypto"
)

// measureAll runs the schedule block by block.
func (h *harness) measureAll(ctx context.Context) {
	perSuite := make([]bool, len(h.systems))
	for i, s := range h.systems {
		perSuite[i] = s.PerSuite()
	}
	pts := points(h.o)
	steps := makePlan(len(h.o.suites), pts, h.o.reps, perSuite)
	var planned []step
	for _, st := range steps {
		if h.live[st.sys] {
			planned = append(planned, st)
		}
	}
	h.prog = newProgress(h.stderr, len(planned))
	defer h.prog.end()
	for b, suite := range h.o.suites {
		keyed := make([]bool, len(h.systems))
		for i, s := range h.systems {
			if !h.live[i] || !s.PerSuite() || ctx.Err() != nil {
				continue
			}
			h.prog.note("bench: keying %s for %s", s.Label(), system.SuiteName(suite))
			err := s.Key(ctx, suite)
			if err == nil {
				err = h.verify(ctx, s)
			}
			switch {
			case err == nil:
				keyed[i] = true
				recordDriver(h.infos[i], s, system.SuiteName(suite))
			case system.IsUnavailable(err):
				h.infos[i].Unavailable[system.SuiteName(suite)] = oneLine(err)
				h.prog.note("bench: %s: %s unavailable: %v", s.Label(), system.SuiteName(suite), err)
			default:
				h.infos[i].Failed[system.SuiteName(suite)] = oneLine(err)
				h.prog.note("bench: %s: %s failed: %v", s.Label(), system.SuiteName(suite), err)
			}
		}
		for _, st := range planned {
			if st.block != b {
				continue
			}
			if ctx.Err() != nil {
				return
			}
			s := h.systems[st.sys]
			if s.PerSuite() && !keyed[st.sys] {
				h.prog.skip(1)
				continue
			}
			h.runStep(ctx, st, suite)
		}
		for i, s := range h.systems {
			if keyed[i] {
				if err := s.Unkey(ctx); err != nil {
					h.prog.note("bench: %s: unkey: %v", s.Label(), err)
				}
			}
		}
	}
}

// cpuSample is the CPU time counters at one instant.
type cpuSample struct {
	a, b, self, ksoftirqd time.Duration
	host                  procstat.Host
}

func (h *harness) sample(s system.System) cpuSample {
	pa, pb := s.Gateways()
	var c cpuSample
	c.a, c.b = procstat.SumCPU(pa), procstat.SumCPU(pb)
	c.self = procstat.SumCPU([]int{os.Getpid()})
	c.ksoftirqd = procstat.SumCPU(h.ksoftirqd)
	c.host, _ = procstat.ReadHost()
	return c
}

func cpuDelta(c0, c1 cpuSample, generator bool) *report.CPU {
	host := c1.host.Sub(c0.host)
	c := &report.CPU{
		GwA: (c1.a - c0.a).Seconds(), GwB: (c1.b - c0.b).Seconds(),
		HostBusy: host.Busy().Seconds(), HostSoftirq: host.Softirq.Seconds(),
		Ksoftirqd: (c1.ksoftirqd - c0.ksoftirqd).Seconds(),
	}
	if generator {
		c.Generator = (c1.self - c0.self).Seconds()
	}
	return c
}

func pointName(p point) string {
	switch p.kind {
	case report.KindTCP:
		return "TCP MSS " + report.MSSName(p.mss)
	case report.KindUDP:
		return "UDP 64 B"
	}
	return "ping"
}

// runStep makes one run and records it.
func (h *harness) runStep(ctx context.Context, st step, suite crypto.Suite) {
	s := h.systems[st.sys]
	h.seq++
	r := report.Run{System: s.Name(), Kind: st.pt.kind, MSS: st.pt.mss, Rep: st.rep + 1, Block: st.block,
		Seq: h.seq, Start: time.Now()}
	suiteName := s.Cipher()
	if s.PerSuite() {
		r.Suite = system.SuiteName(suite)
		suiteName = r.Suite
	}
	what := fmt.Sprintf("%s, %s, %s, run %d/%d", s.Label(), suiteName, pointName(st.pt), st.rep+1, h.o.reps)
	h.prog.running(what)

	ep := h.endpoints(s)
	h.settle(ctx, s)
	var c0, c1 cpuSample
	profiled := func() error { return nil }
	window := func(start bool) {
		if start {
			c0 = h.sample(s)
			if st.pt.kind != report.KindPing {
				profiled = h.startProfile(ctx, s, runName(r.Seq, r.System, r.Suite, pointName(st.pt)+fmt.Sprintf(" run %d", r.Rep)))
			}
		} else {
			c1 = h.sample(s)
		}
	}
	defer func() {
		if err := profiled(); err != nil {
			h.prog.note("bench: %s: profile: %v", s.Label(), err)
		}
	}()
	before, hasCounters, cerr := s.Counters(ctx)
	var result string
	err := cerr
	if err == nil {
		switch st.pt.kind {
		case report.KindTCP:
			o := load.TCPOptions{From: ep.From, To: ep.To, Dst: ep.Dst, MSS: st.pt.mss,
				Omit: h.o.omit, Duration: h.o.duration, Window: window}
			var res load.TCPResult
			if h.o.tool == "iperf3" {
				res, err = load.IPerf3TCP(ctx, o, h.env.Dir)
			} else {
				res, err = load.TCP(ctx, o)
			}
			r.BitsPerSecond, r.Bytes, r.Seconds = res.Bitrate(), res.Bytes, res.Elapsed.Seconds()
			r.Retransmits, r.MSSSeen = res.Retransmits, res.MSS
			result = fmt.Sprintf("%.0f Mbit/s, %d retransmits, mss %d", res.Bitrate()/1e6, res.Retransmits, res.MSS)
			if err == nil {
				r.CPU = cpuDelta(c0, c1, h.o.tool == "go")
			}
		case report.KindUDP:
			var res load.UDPResult
			res, err = load.UDP(ctx, load.UDPOptions{From: ep.From, To: ep.To, Dst: ep.Dst, Size: 64,
				Omit: h.o.omit, Duration: h.o.udpDuration, Window: window})
			r.PacketsPerSecond, r.Sent, r.Received, r.PayloadSize = res.PacketRate(), res.Sent, res.Received, res.Size
			r.Seconds = res.Elapsed.Seconds()
			result = fmt.Sprintf("%.0f kpps received, %.1f%% lost", res.PacketRate()/1e3, 100*res.Loss())
			if err == nil {
				r.CPU = cpuDelta(c0, c1, true)
			}
		case report.KindPing:
			var rtt load.RTT
			var hc *load.HopCapture
			// The hops are the gateways' forwarding: a host-to-host
			// system's echoes cross no LAN link to follow.
			if h.o.pingHops && system.Group(s) == "" {
				hc, err = load.StartHopCapture(s.Topology())
			}
			if err == nil {
				rtt, err = load.Ping(ctx, ep.From, ep.Dst, h.o.pingCount)
			}
			us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
			r.RTTMinUs, r.RTTAvgUs, r.RTTMaxUs = us(rtt.Min), us(rtt.Avg), us(rtt.Max)
			result = fmt.Sprintf("rtt avg %.0f µs", us(rtt.Avg))
			if hc != nil {
				hops, herr := hc.Stop(rtt)
				if err == nil && herr != nil {
					err = herr
				}
				if m := load.MedianHops(hops); err == nil {
					r.Hops = &report.Hops{AOutUs: us(m.AOut), BInUs: us(m.BIn), ServerUs: us(m.Server), BOutUs: us(m.BOut),
						AInUs: us(m.AIn), WireUs: us(m.Wire), ClientUs: us(m.Client), Followed: len(hops)}
					result += fmt.Sprintf("; A %.0f+%.0f, B %.0f+%.0f µs", us(m.AOut), us(m.AIn), us(m.BIn), us(m.BOut))
				}
			}
		}
	}
	if err == nil && hasCounters {
		after, _, cerr := s.Counters(ctx)
		switch {
		case cerr != nil:
			err = cerr
		default:
			r.SA = &report.SACounters{OutPackets: after.OutPackets - before.OutPackets,
				InPackets: after.InPackets - before.InPackets, InDrops: after.InDrops - before.InDrops}
			if r.SA.OutPackets == 0 || r.SA.InPackets == 0 {
				err = fmt.Errorf("the tunnel's states counted %d packets out and %d in: the traffic did not go through it",
					r.SA.OutPackets, r.SA.InPackets)
			}
		}
	}
	if err != nil {
		r.Error = oneLine(err)
		result = "failed: " + r.Error
	}
	h.rep.Runs = append(h.rep.Runs, r)
	h.prog.finished(what, result)
}
