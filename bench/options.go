package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/espd/espd/bench/system"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
)

// Defaults of the flags.
const (
	defaultSystems = "routing,espd,xfrm,xfrm-pcrypt,libipsec,wireguard-go,espd-charon"
	defaultSuites  = "aes128gcm16,aes256gcm16,chacha20poly1305,aes128-sha256,aes256-sha256,aes256-sha384,aes128-sha1"
	defaultMSS     = "max,1000,500,200"
)

// options are the harness's settings after flag parsing.
type options struct {
	systems     []string
	suites      []crypto.Suite
	mss         []int
	duration    time.Duration
	omit        time.Duration
	udpDuration time.Duration
	reps        int
	tool        string
	udp, ping   bool
	pingCount   int
	pingHops    bool
	family      testbed.Family
	out         string
	jsonPath    string
	svgPath     string
	mdPath      string
	espdBin     string
	baselineBin string
	wgBin       string
	keep        bool
	verbose     bool
	quick       bool
	render      string
	args        []string
	// profile, if set, is the directory that receives CPU profiles of
	// espd's gateways over each measured window (profile.go).
	profile string
	// scale is the many-tunnel, many-stream mode (scale.go).
	scale scaleOptions
	// xfrmGuest runs the harness inside the xfrmguest guest (a kernel
	// with XFRM ESP under qemu) instead of on this machine.
	xfrmGuest bool
	// guestMemoryMB is the guest's memory.
	guestMemoryMB int
	// suiteNames are the suites as named on the command line's list, in
	// the order of suites.
	suiteNames []string
}

// parseOptions parses the command line.
func parseOptions(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o                    = &options{args: args}
		systems, suites, mss string
		noAESNI, ipv6        bool
	)
	fs.StringVar(&systems, "systems", defaultSystems, "systems to compare, comma-separated, or \"all\": "+strings.Join(systemNames(), ", "))
	fs.BoolVar(&noAESNI, "noaesni", false, "add espd and each given system's no-AES-NI twin (Go: AES-NI, PCLMULQDQ, AVX2 off; kernel XFRM: generic drivers)")
	fs.StringVar(&suites, "suites", defaultSuites, "ESP suites, comma-separated (strongSwan names); 3des-* and camellia*-* run for XFRM only (espd refuses them)")
	fs.StringVar(&mss, "mss", defaultMSS, "TCP MSS values, comma-separated; max is the path's own")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured time of each TCP run")
	fs.DurationVar(&o.omit, "omit", 500*time.Millisecond, "warm-up before each measured window, not counted")
	fs.DurationVar(&o.udpDuration, "udp-duration", 2*time.Second, "measured time of each UDP packet-rate run")
	fs.IntVar(&o.reps, "reps", 3, "runs of each point, interleaved across systems")
	fs.StringVar(&o.tool, "tool", "go", "TCP traffic generator: go (built in) or iperf3 (Debian's iperf3)")
	fs.BoolVar(&o.udp, "udp", true, "measure the rate of 64-byte UDP datagrams through each tunnel")
	fs.BoolVar(&o.ping, "ping", true, "measure ping round-trip time through each idle tunnel")
	fs.IntVar(&o.pingCount, "ping-count", 20, "echo requests per ping run")
	fs.BoolVar(&o.pingHops, "ping-hops", false, "with -ping, capture the gateways' links and report where each round trip goes")
	fs.BoolVar(&ipv6, "6", false, "IPv6 inside and outside the tunnels (2001:db8::/32) instead of IPv4")
	fs.StringVar(&o.out, "out", "bench-out", "directory of the outputs")
	fs.StringVar(&o.jsonPath, "json", "", "JSON file of every run (default OUT/results.json)")
	fs.StringVar(&o.svgPath, "svg", "", "SVG chart of the TCP goodput (default OUT/throughput.svg)")
	fs.StringVar(&o.mdPath, "md", "", "Markdown tables (default OUT/tables.md)")
	fs.StringVar(&o.espdBin, "espd", "", "espd binary to run (default: go build ./cmd/espd into a temporary directory)")
	fs.StringVar(&o.wgBin, "wireguard-go", "", "wireguard-go binary (default: wireguard-go on PATH or in Go's bin directory)")
	fs.StringVar(&o.baselineBin, "espd-baseline", "", "another espd binary (e.g. an earlier commit's) that the systems espd-baseline and espd-udp-baseline run, for a before/after comparison in one run")
	fs.StringVar(&o.profile, "profile", "", "directory that receives a CPU profile of each espd gateway over each measured window (go tool pprof FILE)")
	fs.BoolVar(&o.keep, "keep", false, "keep the working directory (logs, configurations) instead of removing it")
	fs.BoolVar(&o.verbose, "v", false, "log every setup step")
	fs.StringVar(&o.render, "render", "", "print the tables and write the chart and Markdown of an earlier run's JSON file, measuring nothing")
	fs.BoolVar(&o.xfrmGuest, "xfrm-guest", false, "run the harness inside a qemu guest with Debian's kernel (XFRM ESP, pcrypt), built by xfrmguest/build.sh: an emulated correctness run whose figures say nothing about speed; defaults: "+guestDefaultsText)
	fs.IntVar(&o.guestMemoryMB, "guest-memory", 1024, "the -xfrm-guest guest's memory in MB")
	fs.BoolVar(&o.quick, "quick", false, "smoke run: routing and espd only, aes128gcm16, MSS max, 2 s, one run, no UDP or ping (flags given explicitly still apply)")
	o.scale.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./bench [flags]\n\nCompares espd with plain routing, kernel XFRM, strongSwan's kernel-libipsec and wireguard-go\non a line of network namespaces client - gwA - gwB - server. Needs root.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.quick {
		o.quick = true
		quick := map[string]func(){
			"systems":  func() { systems = "routing,espd" },
			"suites":   func() { suites = "aes128gcm16" },
			"mss":      func() { mss = "max" },
			"duration": func() { o.duration = 2 * time.Second },
			"reps":     func() { o.reps = 1 },
			"udp":      func() { o.udp = false },
			"ping":     func() { o.ping = false },
		}
		for name, apply := range quick {
			if !set[name] {
				apply()
			}
		}
	}
	if err := o.scale.finish(set, &systems, &suites, &mss, o); err != nil {
		return nil, err
	}
	if o.xfrmGuest {
		for name, v := range guestDefaults {
			if !set[name] {
				switch name {
				case "systems":
					systems = v
				case "suites":
					suites = v
				case "mss":
					mss = v
				case "duration":
					o.duration, _ = time.ParseDuration(v)
				case "omit":
					o.omit, _ = time.ParseDuration(v)
				case "reps":
					o.reps, _ = strconv.Atoi(v)
				case "udp":
					o.udp = v == "true"
				case "ping":
					o.ping = v == "true"
				case "ping-count":
					o.pingCount, _ = strconv.Atoi(v)
				}
			}
		}
		if o.render != "" {
			return nil, errors.New("-xfrm-guest and -render: one or the other")
		}
		if o.espdBin != "" || o.wgBin != "" {
			return nil, errors.New("-xfrm-guest builds the espd it runs from this checkout: -espd and -wireguard-go do not apply")
		}
		if o.guestMemoryMB < 256 {
			return nil, fmt.Errorf("-guest-memory %d: at least 256 MB", o.guestMemoryMB)
		}
	}
	var err error
	if o.systems, err = parseSystems(systems, noAESNI); err != nil {
		return nil, err
	}
	for _, name := range splitList(suites) {
		s, err := system.ParseSuite(name)
		if err != nil {
			return nil, fmt.Errorf("-suites: %v", err)
		}
		o.suites = append(o.suites, s)
		o.suiteNames = append(o.suiteNames, system.SuiteName(s))
	}
	if len(o.suites) == 0 {
		return nil, errors.New("-suites: none given")
	}
	for _, m := range splitList(mss) {
		if m == "max" {
			o.mss = append(o.mss, 0)
			continue
		}
		n, err := strconv.Atoi(m)
		if err != nil || n < 88 || n > 65495 {
			return nil, fmt.Errorf("-mss: %q is neither max nor an MSS of 88-65495 bytes", m)
		}
		o.mss = append(o.mss, n)
	}
	if len(o.mss) == 0 {
		return nil, errors.New("-mss: none given")
	}
	switch {
	case o.duration < 100*time.Millisecond:
		return nil, fmt.Errorf("-duration %v: at least 100ms", o.duration)
	case o.udpDuration < 100*time.Millisecond:
		return nil, fmt.Errorf("-udp-duration %v: at least 100ms", o.udpDuration)
	case o.omit < 0:
		return nil, fmt.Errorf("-omit %v: negative", o.omit)
	case o.reps < 1:
		return nil, fmt.Errorf("-reps %d: at least 1", o.reps)
	case o.pingCount < 1:
		return nil, fmt.Errorf("-ping-count %d: at least 1", o.pingCount)
	}
	if o.tool != "go" && o.tool != "iperf3" {
		return nil, fmt.Errorf("-tool %q: go or iperf3", o.tool)
	}
	o.family = testbed.IPv4
	if ipv6 {
		o.family = testbed.IPv6
	}
	if o.jsonPath == "" {
		o.jsonPath = filepath.Join(o.out, "results.json")
	}
	if o.svgPath == "" {
		o.svgPath = filepath.Join(o.out, "throughput.svg")
	}
	if o.mdPath == "" {
		o.mdPath = filepath.Join(o.out, "tables.md")
	}
	return o, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func systemNames() []string {
	var names []string
	for _, s := range system.All() {
		names = append(names, s.Name())
	}
	return names
}

// parseSystems checks the -systems list, expands "all" and adds the
// no-AES-NI variants for -noaesni; the result is in report order.
func parseSystems(list string, noAESNI bool) ([]string, error) {
	known := systemNames()
	want := map[string]bool{}
	for _, name := range splitList(list) {
		if name == "all" {
			for _, k := range known {
				want[k] = true
			}
			continue
		}
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("-systems: unknown system %q (known: %s)", name, strings.Join(known, ", "))
		}
		want[name] = true
	}
	if noAESNI {
		// espd's raw ESP always; the no-AES-NI twin of every other
		// system given that does its crypto in software.
		want["espd-noaesni"] = true
		for _, k := range known {
			if twin := k + "-noaesni"; want[k] && slices.Contains(known, twin) {
				want[twin] = true
			}
		}
	}
	var out []string
	for _, k := range known {
		if want[k] {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("-systems: none given")
	}
	return out, nil
}
