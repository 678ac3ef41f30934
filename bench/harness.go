package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/espd/espd/bench/load"
	"github.com/espd/espd/bench/procstat"
	"github.com/espd/espd/bench/report"
	"github.com/espd/espd/bench/system"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
)

// namespacePrefix starts the names of the harness's namespaces.
const namespacePrefix = "ebench"

// cleanups runs teardown functions once, newest first, from the normal
// exit path or from the signal handler, whichever comes first.
type cleanups struct {
	mu   sync.Mutex
	fns  []func()
	done bool
}

func (c *cleanups) add(fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fns = append(c.fns, fn)
}

func (c *cleanups) run() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return
	}
	c.done = true
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
}

// harness is one run of the benchmark.
type harness struct {
	o              *options
	stdout, stderr io.Writer
	env            *system.Env
	systems        []system.System
	infos          []*report.System
	live           []bool
	rep            *report.Report
	prog           *progress
	ksoftirqd      []int
	seq            int
	espdVersion    string
}

// run is the whole harness: set up, measure, report, tear down.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	o, err := parseOptions(args, stderr)
	if err != nil {
		return err
	}
	if o.render != "" {
		rep, err := report.ReadJSON(o.render)
		if err != nil {
			return err
		}
		h := &harness{o: o, stdout: stdout, stderr: stderr, rep: rep}
		if o.jsonPath == filepath.Join(o.out, "results.json") {
			o.jsonPath = "" // do not rewrite the input's copy
		}
		return h.write()
	}
	if o.xfrmGuest {
		return runInGuest(ctx, o, stdout, stderr)
	}
	ctx, cl, done, err := prepare(ctx, stderr, "tearing down")
	if err != nil {
		return err
	}
	defer done()
	work, err := os.MkdirTemp("", "espd-bench-")
	if err != nil {
		return err
	}
	cl.add(func() {
		if o.keep {
			fmt.Fprintf(stderr, "bench: logs and configurations kept in %s\n", work)
			return
		}
		os.RemoveAll(work)
	})

	h := &harness{o: o, stdout: stdout, stderr: stderr}
	h.env = &system.Env{Dir: work, Family: o.family, Prefix: namespacePrefix, WireGuardBin: o.wgBin}
	h.env.Profile = o.profile != ""
	h.env.BaselineBin = o.baselineBin
	if o.verbose {
		h.env.Logf = func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) }
	}
	if h.env.EspdBin = o.espdBin; h.env.EspdBin == "" {
		fmt.Fprintln(stderr, "bench: building espd (go build ./cmd/espd)")
		h.env.EspdBin = filepath.Join(work, "bin", "espd")
		if err := goBuild(ctx, h.env.EspdBin, "github.com/espd/espd/cmd/espd"); err != nil {
			return err
		}
	}
	espdVersion := "espd " + o.espdBin
	if o.espdBin == "" {
		espdVersion = "espd built from " + sourceVersion()
	}
	h.espdVersion = espdVersion
	if h.env.WireGuardBin == "" {
		h.env.WireGuardBin = system.FindWireGuard()
	}
	if o.tool == "iperf3" {
		if err := load.IPerf3Available(); err != nil {
			return fmt.Errorf("-tool iperf3: %w", err)
		}
	}
	if h.ksoftirqd, err = procstat.KernelThreads("ksoftirqd/"); err != nil {
		return err
	}
	h.rep = &report.Report{
		Machine: describeMachine(), Command: strings.Join(append([]string{"go run ./bench"}, args...), " "),
		Tool: o.tool, Family: o.family.String(), Started: time.Now(),
		Duration: o.duration.String(), Omit: o.omit.String(), Reps: o.reps, MSS: o.mss, UDP: o.udp, Ping: o.ping,
	}
	if o.udp {
		h.rep.UDPDuration = o.udpDuration.String()
	}
	h.rep.Suites = o.suiteNames

	h.setup(ctx, cl)
	if err := ctx.Err(); err != nil {
		return err
	}
	if o.scale.on {
		h.rep.ScalePoints = o.scale.points
		h.measureScale(ctx)
	} else {
		h.measureAll(ctx)
	}
	h.rep.Finished = time.Now()
	cl.run() // tear down before writing: the report does not need the systems
	return h.write()
}

// goBuild builds a package of this module (or one it requires) into out,
// with the environment the tests build espd with (testbed.BuildEnv).
func goBuild(ctx context.Context, out, pkg string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Env = testbed.BuildEnv() // espd as it ships: with runtime/secret
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build %s (run the harness inside the espd module, or give -espd): %w\n%s", pkg, err, b)
	}
	return nil
}

// setup checks which systems can run, and sets them up.
func (h *harness) setup(ctx context.Context, cl *cleanups) {
	byName := map[string]system.System{}
	for _, s := range system.All() {
		byName[s.Name()] = s
	}
	for _, name := range h.o.systems {
		s := byName[name]
		info := &report.System{Name: s.Name(), Label: s.Label(), PerSuite: s.PerSuite(), Cipher: s.Cipher(),
			Unavailable: map[string]string{}, Failed: map[string]string{}}
		h.systems = append(h.systems, s)
		h.infos = append(h.infos, info)
		h.live = append(h.live, false)
		if err := s.Available(h.env); err != nil {
			info.Skipped = err.Error()
			fmt.Fprintf(h.stderr, "bench: %s: skipped: %v\n", s.Label(), err)
			continue
		}
		info.Version = version(s.Name(), h.env)
		switch {
		case strings.HasSuffix(s.Name(), "-baseline"):
			info.Version = "espd " + h.o.baselineBin
		case strings.HasPrefix(s.Name(), "espd"):
			info.Version = strings.TrimSuffix(h.espdVersion+"; "+info.Version, "; ")
		}
	}
	for i, s := range h.systems {
		if h.infos[i].Skipped != "" || ctx.Err() != nil {
			continue
		}
		fmt.Fprintf(h.stderr, "bench: setting up %s\n", s.Label())
		cl.add(func() {
			if err := s.Close(); err != nil {
				fmt.Fprintf(h.stderr, "bench: %s: teardown: %v\n", s.Label(), err)
			}
		})
		err := s.Setup(ctx, h.env)
		if err == nil && !s.PerSuite() {
			err = h.verify(ctx, s)
		}
		if err != nil {
			h.infos[i].Failed[""] = oneLine(err)
			fmt.Fprintf(h.stderr, "bench: %s: setup failed: %v\n", s.Label(), err)
			continue
		}
		h.live[i] = true
	}
}

// sourceVersion describes the checkout espd is built from: its commit,
// and "+changes" when the working tree differs from it.
func sourceVersion() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty=+changes").Output()
	if err != nil {
		return "a tree without git"
	}
	return "commit " + strings.TrimSpace(string(out))
}

// version names the binary a system runs, for the JSON.
func version(name string, env *system.Env) string {
	switch name {
	case "libipsec", "espd-charon":
		out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "strongswan-charon").Output()
		if err != nil || len(out) == 0 {
			return "strongSwan (version unknown)"
		}
		return "strongSwan " + strings.TrimSpace(string(out)) + " (Debian package strongswan-charon)"
	case "wireguard-go", "wireguard-go-noaesni":
		out, err := exec.Command(env.WireGuardBin, "--version").Output()
		if err != nil {
			return ""
		}
		return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	return ""
}

// oneLine shortens an error to its first line for the tables.
func oneLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// server returns the server address of the run's family.
func (h *harness) server() netip.Addr {
	return testbed.Pick(h.o.family, testbed.ServerV4, testbed.ServerV6).Addr()
}

// verify pings the server from the client through a system.
func (h *harness) verify(ctx context.Context, s system.System) error {
	var err error
	for try := 0; try < 3; try++ {
		if _, err = load.Ping(ctx, s.Topology().Client, h.server(), 3); err == nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("no ping through %s: %w", s.Label(), err)
}

// settle waits, up to 15 s, until one echo request crosses the system:
// after a UDP flood, a data path with a deep queue (charon's libipsec)
// may still be working off the backlog, and the next run should not
// measure that.
func (h *harness) settle(ctx context.Context, s system.System) {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := load.Ping(ctx, s.Topology().Client, h.server(), 1); err == nil {
			return
		}
	}
}

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

	top := s.Topology()
	dst := h.server()
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
			o := load.TCPOptions{From: top.Client, To: top.Server, Dst: dst, MSS: st.pt.mss,
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
			res, err = load.UDP(ctx, load.UDPOptions{From: top.Client, To: top.Server, Dst: dst, Size: 64,
				Omit: h.o.omit, Duration: h.o.udpDuration, Window: window})
			r.PacketsPerSecond, r.Sent, r.Received, r.PayloadSize = res.PacketRate(), res.Sent, res.Received, res.Size
			r.Seconds = res.Elapsed.Seconds()
			result = fmt.Sprintf("%.0f kpps received, %.1f%% lost", res.PacketRate()/1e3, 100*res.Loss())
			if err == nil {
				r.CPU = cpuDelta(c0, c1, true)
			}
		case report.KindPing:
			var rtt load.RTT
			rtt, err = load.Ping(ctx, top.Client, dst, h.o.pingCount)
			us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
			r.RTTMinUs, r.RTTAvgUs, r.RTTMaxUs = us(rtt.Min), us(rtt.Avg), us(rtt.Max)
			result = fmt.Sprintf("rtt avg %.0f µs", us(rtt.Avg))
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

// write prints the tables and writes the JSON, the chart and the
// Markdown.
func (h *harness) write() error {
	rep := h.rep
	for _, info := range h.infos {
		rep.Systems = append(rep.Systems, *info)
	}
	var paths []string
	for _, p := range []string{h.o.jsonPath, h.o.svgPath, h.o.mdPath} {
		if p != "" {
			paths = append(paths, p)
		}
	}
	fmt.Fprintln(h.stdout)
	for _, l := range rep.Header() {
		fmt.Fprintln(h.stdout, l)
	}
	for _, t := range rep.Tables() {
		fmt.Fprintln(h.stdout)
		t.Text(h.stdout)
	}
	var errs []error
	for _, p := range paths {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			errs = append(errs, err)
		}
	}
	writeFile := func(path string, fn func(io.Writer) error) {
		f, err := os.Create(path)
		if err == nil {
			err = fn(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			return
		}
		fmt.Fprintf(h.stderr, "bench: wrote %s\n", path)
	}
	if h.o.jsonPath != "" {
		writeFile(h.o.jsonPath, rep.WriteJSON)
	}
	if hasTCP(rep) {
		writeFile(h.o.svgPath, rep.Chart)
	} else if rep.HasScale() {
		writeFile(h.o.svgPath, rep.ScaleChart)
	}
	writeFile(h.o.mdPath, func(w io.Writer) error {
		for _, l := range rep.Header() {
			fmt.Fprintf(w, "%s  \n", l)
		}
		fmt.Fprintln(w)
		for _, t := range rep.Tables() {
			t.Markdown(w)
		}
		return nil
	})
	failed := 0
	for _, r := range rep.Runs {
		if !r.OK() {
			failed++
		}
	}
	if failed > 0 && h.o.render == "" {
		errs = append(errs, fmt.Errorf("%d of %d runs failed (see the JSON)", failed, len(rep.Runs)))
	}
	return errors.Join(errs...)
}

func hasTCP(r *report.Report) bool {
	for _, run := range r.Runs {
		if run.Kind == report.KindTCP && run.OK() && run.System != "routing" {
			return true
		}
	}
	return false
}

// prepare checks that namespaces work here, arranges that Ctrl-C (and
// SIGTERM, SIGHUP) cancels the returned context and runs the cleanups
// (saying what it does: doing), and removes the namespaces a killed run
// left. The caller defers done, which runs the cleanups too.
func prepare(ctx context.Context, stderr io.Writer, doing string) (context.Context, *cleanups, func(), error) {
	if err := testbed.Available(); err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	cl := &cleanups{}
	restore := testbed.HandleSignals(func(sig os.Signal) {
		fmt.Fprintf(stderr, "\nbench: %v: %s\n", sig, doing)
		cancel()
		cl.run()
	})
	done := func() {
		restore()
		cl.run()
		cancel()
	}
	if removed, err := testbed.RemoveStale(namespacePrefix); err != nil {
		done()
		return nil, nil, nil, err
	} else if len(removed) > 0 {
		fmt.Fprintf(stderr, "bench: removed %d namespaces left by a killed run\n", len(removed))
	}
	return ctx, cl, done, nil
}
