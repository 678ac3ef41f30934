package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/espd/espd/bench/load"
	"github.com/espd/espd/bench/procstat"
	"github.com/espd/espd/bench/report"
	"github.com/espd/espd/bench/system"
	"github.com/espd/espd/testbed"
)

// namespacePrefix starts the names of the harness's namespaces.
const namespacePrefix = "ebench"

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
			Group: system.Group(s), Unavailable: map[string]string{}, Failed: map[string]string{}}
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
	case "libipsec", "libipsec-noaesni", "espd-charon":
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

// endpoints returns where the harness measures s: from the client to the
// server of the run's family, or, for a host-to-host system, from gwA to
// gwB's transit address (system.EndpointsOf).
func (h *harness) endpoints(s system.System) system.Endpoints {
	return system.EndpointsOf(s, h.o.family)
}

// verify pings through a system: the server from the client, or a
// host-to-host system's other host from the first.
func (h *harness) verify(ctx context.Context, s system.System) error {
	ep := h.endpoints(s)
	var err error
	for try := 0; try < 3; try++ {
		if _, err = load.Ping(ctx, ep.From, ep.Dst, 3); err == nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("no ping from %s to %v through %s: %w", ep.From.Role, ep.Dst, s.Label(), err)
}

// settle waits, up to 15 s, until one echo request crosses the system:
// after a UDP flood, a data path with a deep queue (charon's libipsec)
// may still be working off the backlog, and the next run should not
// measure that.
func (h *harness) settle(ctx context.Context, s system.System) {
	ep := h.endpoints(s)
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := load.Ping(ctx, ep.From, ep.Dst, 1); err == nil {
			return
		}
	}
}
