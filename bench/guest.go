package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/espd/espd/bench/report"
	"github.com/espd/espd/testbed"
	"github.com/espd/espd/xfrmguest"
)

// GuestLabel marks every figure of a run made inside the xfrmguest guest,
// in the JSON (report.Report.Emulated), the tables and the chart.
const GuestLabel = "emulated correctness run (qemu TCG, 1 vCPU: says nothing about speed)"

// guestDefaults are the -xfrm-guest run's defaults for the flags not
// given: the systems that need a kernel with ESP, one AEAD and one CBC
// suite, one MSS, short runs, one repetition, and one cheap ping check.
var guestDefaults = map[string]string{
	"systems":    "routing,xfrm,xfrm-pcrypt,espd",
	"suites":     "aes128gcm16,aes128-sha256",
	"mss":        "max",
	"duration":   "1s",
	"omit":       "200ms",
	"reps":       "1",
	"udp":        "false",
	"ping":       "true",
	"ping-count": "3",
}

const guestDefaultsText = "-systems routing,xfrm,xfrm-pcrypt,espd -suites aes128gcm16,aes128-sha256 -mss max -duration 1s -omit 200ms -reps 1 -udp=false -ping-count 3"

// Paths in the guest.
const (
	guestBin     = "/opt/espd/bin/bench"
	guestEspd    = "/opt/espd/bin/espd"
	guestOut     = "/tmp/bench-out"
	guestLog     = "/tmp/bench.log"
	guestRC      = "/tmp/bench.rc"
	guestTimeout = 6 * time.Hour
)

// guestArgs are the harness's flags for its run inside the guest: o as
// parsed here, with the guest's paths.
func guestArgs(o *options) []string {
	var mss []string
	for _, m := range o.mss {
		mss = append(mss, report.MSSName(m))
	}
	args := []string{
		"-systems", strings.Join(o.systems, ","),
		"-suites", strings.Join(o.suiteNames, ","),
		"-mss", strings.Join(mss, ","),
		"-duration", o.duration.String(), "-omit", o.omit.String(), "-udp-duration", o.udpDuration.String(),
		"-reps", strconv.Itoa(o.reps), "-tool", o.tool,
		"-udp=" + strconv.FormatBool(o.udp), "-ping=" + strconv.FormatBool(o.ping), "-ping-count", strconv.Itoa(o.pingCount), "-ping-hops=" + strconv.FormatBool(o.pingHops),
		"-6=" + strconv.FormatBool(o.family == testbed.IPv6),
		"-espd", guestEspd, "-out", guestOut,
	}
	if o.scale.on {
		// The points, not how they were asked for: a correctness run of
		// the scale mode (every tunnel keyed, carried and counted).
		var pts []string
		for _, p := range o.scale.points {
			pts = append(pts, fmt.Sprintf("%dx%d", p.Tunnels, p.Streams))
		}
		args = append(args, "-scale-points", strings.Join(pts, ","), "-probe-rate", strconv.Itoa(o.scale.probeRate))
	}
	if o.verbose {
		args = append(args, "-v")
	}
	return args
}

// shellQuote quotes s for the guest's sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// moduleRoot is the directory of the espd module (the checkout's root)
// whose espd the harness builds.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/espd/espd").Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		return "", fmt.Errorf("-xfrm-guest: run the harness from an espd checkout (go list -m github.com/espd/espd: %q, %v)", dir, err)
	}
	return dir, nil
}

// goBuildStatic builds a static binary (CGO_ENABLED=0) for the guest, with
// the environment espd ships with (testbed.BuildEnv).
func goBuildStatic(ctx context.Context, dir, out, pkg string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(testbed.BuildEnv(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s for the guest: %w\n%s", pkg, err, b)
	}
	return nil
}

// runInGuest is -xfrm-guest: it builds the harness and espd as static
// binaries, boots the xfrmguest guest with them, runs the harness there
// (its own namespaces, espd, the kernel's XFRM and pcrypt), follows its
// progress, brings its JSON back over the command port and writes the
// report here, labelled as an emulated correctness run.
func runInGuest(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	if err := xfrmguest.Available(); err != nil {
		return err
	}
	ctx, cl, done, err := prepare(ctx, stderr, "stopping the guest")
	if err != nil {
		return err
	}
	defer done()
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "espd-bench-guest-")
	if err != nil {
		return err
	}
	cl.add(func() {
		if o.keep {
			fmt.Fprintf(stderr, "bench: the guest's console and qemu's log kept in %s\n", work)
			return
		}
		os.RemoveAll(work)
	})
	fmt.Fprintln(stderr, "bench: building the harness and espd as static binaries for the guest")
	benchBin, espdBin := filepath.Join(work, "bench"), filepath.Join(work, "espd")
	if err := goBuildStatic(ctx, root, benchBin, "github.com/espd/espd/bench"); err != nil {
		return err
	}
	if err := goBuildStatic(ctx, root, espdBin, "github.com/espd/espd/cmd/espd"); err != nil {
		return err
	}
	fmt.Fprintln(stderr, "bench: building the guest image (bash xfrmguest/build.sh; cached)")
	img, err := xfrmguest.Build(ctx, filepath.Join(root, "xfrmguest", "build.sh"))
	if err != nil {
		return err
	}

	// The namespace that holds qemu's tap device (RemoveStale clears it
	// after a killed run).
	node, err := testbed.NewNode(namespacePrefix, "guest")
	if err != nil {
		return err
	}
	cl.add(func() { _ = node.Remove() })
	fmt.Fprintf(stderr, "bench: booting Debian's kernel %s under qemu (TCG, 1 vCPU, %d MB)\n", img.KernelVersion, o.guestMemoryMB)
	g, err := xfrmguest.Boot(ctx, img, xfrmguest.Options{
		Node: node, Tap: "ebtap0", Addr: "198.19.255.2/30",
		Files:    map[string]string{guestBin: benchBin, guestEspd: espdBin},
		MemoryMB: o.guestMemoryMB, WorkDir: work,
	})
	if err != nil {
		return err
	}
	cl.add(func() {
		if err := g.Close(); err != nil {
			fmt.Fprintf(stderr, "bench: stopping qemu: %v\n", err)
		}
	})
	fmt.Fprintf(stderr, "bench: guest up in %v; running the harness in it\n", g.BootTime.Round(time.Millisecond))

	var quoted []string
	for _, a := range guestArgs(o) {
		quoted = append(quoted, shellQuote(a))
	}
	// In the background, so that its log (stderr: the tables are printed
	// here) can be followed.
	start := fmt.Sprintf("cd /tmp && (%s %s >/dev/null 2>%s; echo $? >%s) >/dev/null 2>&1 &",
		guestBin, strings.Join(quoted, " "), guestLog, guestRC)
	if _, err := g.MustRun(ctx, start); err != nil {
		return err
	}
	rc, err := followGuest(ctx, g, stderr)
	if err != nil {
		return err
	}
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer rcancel()
	js, err := g.MustRun(rctx, "cat "+guestOut+"/results.json")
	if err != nil {
		return fmt.Errorf("the harness in the guest exited %d and left no JSON: %w", rc, err)
	}
	rep, err := report.ParseJSON([]byte(js))
	if err != nil {
		return fmt.Errorf("the guest's JSON: %w", err)
	}
	rep.Emulated = GuestLabel
	rep.Command = strings.Join(append([]string{"go run ./bench"}, o.args...), " ")
	rep.Machine.Hypervisor = fmt.Sprintf("qemu TCG (%s), 1 vCPU, %d MB, Debian kernel %s", xfrmguest.QEMU, o.guestMemoryMB, img.KernelVersion)
	for i, s := range rep.Systems {
		if strings.HasPrefix(s.Name, "espd") {
			rep.Systems[i].Version = strings.Replace(s.Version, "espd "+guestEspd, "espd built from "+sourceVersion()+" (static, in the guest)", 1)
		}
	}
	cl.run() // the guest is no longer needed
	h := &harness{o: o, stdout: stdout, stderr: stderr, rep: rep}
	err = h.write()
	if err == nil && rc != 0 {
		err = fmt.Errorf("the harness in the guest exited %d", rc)
	}
	return err
}

// followGuest copies the guest harness's log to stderr as it grows, every
// few seconds, until the harness exits, and returns its exit status.
func followGuest(ctx context.Context, g *xfrmguest.Guest, stderr io.Writer) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, guestTimeout)
	defer cancel()
	var off int
	for {
		// The status first: a log read after it is complete.
		rcOut, _, err := g.Run(ctx, "cat "+guestRC+" 2>/dev/null")
		if err != nil {
			return 0, err
		}
		// The log's size, then the bytes up to it not shown yet.
		out, err := g.MustRun(ctx, fmt.Sprintf("n=$(wc -c <%s); echo $n; head -c $n %s | tail -c +%d", guestLog, guestLog, off+1))
		if err != nil {
			return 0, err
		}
		size, rest, _ := strings.Cut(out, "\n")
		if n, err := strconv.Atoi(strings.TrimSpace(size)); err == nil && n > off {
			off = n
			fmt.Fprintln(stderr, strings.TrimRight(rest, "\n"))
		}
		if s := strings.TrimSpace(rcOut); s != "" {
			rc, err := strconv.Atoi(s)
			if err != nil {
				return 0, fmt.Errorf("the guest harness's status %q", s)
			}
			return rc, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("the harness in the guest: %w", ctx.Err())
		case <-time.After(3 * time.Second):
		}
	}
}
