package metrics

import (
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
)

var (
	flagMetricsBefore = flag.String("metrics-espd-before", "", "BenchmarkMetricsTunnel: an espd binary with the old metrics (per-state series always, built from c140e03) for its before row; empty: no before row")
	flagMetricsStates = flag.Int("metrics-states", scaleStates, "BenchmarkMetricsTunnel: states installed in the scraped espd")
	flagMetricsFor    = flag.Duration("metrics-for", 5*time.Second, "BenchmarkMetricsTunnel: least time of each phase (idle, scraping)")
	flagMetricsProbe  = flag.Duration("metrics-probe", 10*time.Millisecond, "BenchmarkMetricsTunnel: interval of the echo probes through the tunnel")
)

// tunnelGateway is one espd of BenchmarkMetricsTunnel.
type tunnelGateway struct {
	proc *testbed.Process
	ctl  *control.Client
}

// startTunnelGateway starts bin in node with args and connects to its
// control socket.
func startTunnelGateway(b *testing.B, node *testbed.Node, dir, name, bin string, args ...string) *tunnelGateway {
	sock := filepath.Join(dir, name+".sock")
	argv := append([]string{bin, "--tun", "esp0", "--socket", sock, "--log-level", "warn"}, args...)
	if help, _ := exec.Command(bin, "-h").CombinedOutput(); strings.Contains(string(help), "-state-dir") {
		argv = append(argv, "--state-dir", filepath.Join(dir, name+"-state"))
	}
	p, err := node.Start(filepath.Join(dir, name+".log"), argv...)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := testbed.WaitEspd(ctx, node, p, sock, "esp0"); err != nil {
		p.Stop(5 * time.Second)
		b.Fatalf("%s: %v\n%s", name, err, p.Log())
	}
	c, err := control.Dial(ctx, sock)
	if err != nil {
		p.Stop(5 * time.Second)
		b.Fatal(err)
	}
	return &tunnelGateway{proc: p, ctl: c}
}

func (g *tunnelGateway) stop(b *testing.B) {
	g.ctl.Close()
	if err := g.proc.Stop(20 * time.Second); err != nil {
		b.Logf("stop: %v", err)
	}
}

// tunnelKey returns fixed test keys, distinct per SPI.
func tunnelKey(s crypto.Suite, spi uint32) []byte {
	k := make([]byte, s.EncKeyLen())
	for i := range k {
		k[i] = byte(spi>>uint(8*(i%4))) ^ byte(i)
	}
	return k
}

// addTunnel installs one side of the measured tunnel (ESP-in-UDP).
func addTunnel(ctx context.Context, c *control.Client, s crypto.Suite, local, remote netip.Addr, lanL, lanR netip.Prefix, out, in uint32) error {
	for _, cfg := range []sa.Config{
		{SPI: out, Dir: sa.DirOut, Src: local, Dst: remote},
		{SPI: in, Dir: sa.DirIn, Src: remote, Dst: local, ReplayWindow: 128},
	} {
		cfg.Suite, cfg.ReqID, cfg.EncKey = s, 1, tunnelKey(s, cfg.SPI)
		cfg.EncapSrcPort, cfg.EncapDstPort = 4500, 4500
		if err := c.AddSA(ctx, cfg); err != nil {
			return err
		}
	}
	for _, p := range []sa.Policy{
		{Selector: sa.Selector{Src: lanL, Dst: lanR}, Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: 1},
		{Selector: sa.Selector{Src: lanR, Dst: lanL}, Dir: sa.DirIn, Action: sa.ActionProtect, ReqID: 1},
	} {
		if _, err := c.AddPolicy(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// addExtraStates installs n states that no packet uses (half inbound,
// SPIs 0x10000 on, reqid 1000+i) through four concurrent requests.
func addExtraStates(ctx context.Context, c *control.Client, s crypto.Suite, local, remote netip.Addr, n int) error {
	var next atomic.Int64
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					errs <- nil
					return
				}
				cfg := sa.Config{SPI: uint32(0x10000 + i), Suite: s, ReqID: uint32(1000 + i), Dir: sa.DirOut, Src: local, Dst: remote}
				if i%2 == 1 {
					cfg.Dir, cfg.Src, cfg.Dst, cfg.ReplayWindow = sa.DirIn, remote, local, 128
				}
				cfg.EncKey = tunnelKey(s, cfg.SPI)
				if err := c.AddSA(ctx, cfg); err != nil {
					next.Store(int64(n))
					errs <- fmt.Errorf("state %d: %w", i, err)
					return
				}
			}
		}()
	}
	var err error
	for range 4 {
		err = errors.Join(err, <-errs)
	}
	return err
}

// echoServer answers every UDP datagram on conn with itself.
func echoServer(conn *net.UDPConn) {
	buf := make([]byte, 2048)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		conn.WriteToUDPAddrPort(buf[:n], from)
	}
}

// rtts sends an echo request every interval on conn (connected to an echo
// server) until stop is closed, and returns the round-trip times and the
// number of requests without a reply within a second.
func rtts(conn *net.UDPConn, interval time.Duration, stop <-chan struct{}) (rtt []time.Duration, lost int) {
	var req, resp [16]byte
	t := time.NewTicker(interval)
	defer t.Stop()
	for seq := uint64(1); ; seq++ {
		select {
		case <-stop:
			return rtt, lost
		case <-t.C:
		}
		binary.BigEndian.PutUint64(req[:], seq)
		sent := time.Now()
		if _, err := conn.Write(req[:]); err != nil {
			lost++
			continue
		}
		conn.SetReadDeadline(sent.Add(time.Second))
		for {
			n, err := conn.Read(resp[:])
			if err != nil {
				lost++
				break
			}
			if n == len(req) && binary.BigEndian.Uint64(resp[:]) == seq {
				rtt = append(rtt, time.Since(sent))
				break
			}
		}
	}
}

// rttStats summarizes round-trip times in µs.
type rttStats struct{ p50, p99, max float64 }

func summarize(d []time.Duration) rttStats {
	if len(d) == 0 {
		return rttStats{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	us := func(x time.Duration) float64 { return float64(x) / 1e3 }
	return rttStats{p50: us(s[len(s)/2]), p99: us(s[len(s)*99/100]), max: us(s[len(s)-1])}
}

// procStatus returns a field of /proc/pid/status in bytes (VmRSS, VmHWM).
func procStatus(pid int, field string) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(v)
			kb, _ := strconv.ParseUint(f[0], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// countReader counts the bytes read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// scrapeOnce scrapes url as Prometheus does (Accept-Encoding: gzip) and
// returns the bytes on the wire and uncompressed.
func scrapeOnce(c *http.Client, url string) (wire, text int64, err error) {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, errors.New(resp.Status)
	}
	cr := &countReader{r: resp.Body}
	var body io.Reader = cr
	if resp.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(cr)
		if err != nil {
			return 0, 0, err
		}
		body = zr
	}
	text, err = io.Copy(io.Discard, body)
	return cr.n, text, err
}

// tunnelRow is one configuration of gwA in BenchmarkMetricsTunnel.
type tunnelRow struct {
	name string
	bin  string
	args []string
}

// tunnelResult is what BenchmarkMetricsTunnel measured for a row.
type tunnelResult struct {
	installed          time.Duration
	scrapes            []time.Duration // back to back, sorted
	wire, text         int64           // bytes of the last scrape
	rss, growth        uint64          // RSS before the scrapes, peak growth during them
	idle, busy, paced  rttStats
	nIdle, nBusy, nPac int // probes answered
	lost               int // probes lost, all phases
}

// tunnelBench is the fixed part of BenchmarkMetricsTunnel.
type tunnelBench struct {
	b     *testing.B
	top   *testbed.Topology
	dir   string
	bin   string
	suite crypto.Suite
	cli   *net.UDPConn
	httpc *http.Client
}

const tunnelMetricsURL = "http://127.0.0.1:9585/metrics"

// probeWhile measures the echo's RTT while f runs, and at least d.
func (tb *tunnelBench) probeWhile(d time.Duration, f func() error) ([]time.Duration, int, error) {
	stop := make(chan struct{})
	var (
		rtt  []time.Duration
		lost int
		wg   sync.WaitGroup
	)
	wg.Go(func() { rtt, lost = rtts(tb.cli, *flagMetricsProbe, stop) })
	begin := time.Now()
	err := f()
	if rest := d - time.Since(begin); rest > 0 {
		time.Sleep(rest)
	}
	close(stop)
	wg.Wait()
	return rtt, lost, err
}

// row starts both gateways with gwA as r says, installs the states and
// measures.
func (tb *tunnelBench) row(i int, r tunnelRow) (res tunnelResult, err error) {
	ctx := context.Background()
	gwA, gwB := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	// Both gateways start afresh for each row, with SPIs of their own: a
	// state re-added with the same key would restart its sequence
	// numbers below the peer's replay window.
	gb := startTunnelGateway(tb.b, tb.top.GwB, tb.dir, "gwb-"+r.name, tb.bin)
	defer gb.stop(tb.b)
	ga := startTunnelGateway(tb.b, tb.top.GwA, tb.dir, "gwa-"+r.name, r.bin, append([]string{"--metrics-listen", "127.0.0.1:9585"}, r.args...)...)
	defer ga.stop(tb.b)
	spiA, spiB := uint32(0x1001+0x10*i), uint32(0x2001+0x10*i)
	start := time.Now()
	if err := errors.Join(
		addTunnel(ctx, gb.ctl, tb.suite, gwB, gwA, testbed.LANBV4, testbed.LANAV4, spiB, spiA),
		addTunnel(ctx, ga.ctl, tb.suite, gwA, gwB, testbed.LANAV4, testbed.LANBV4, spiA, spiB),
		addExtraStates(ctx, ga.ctl, tb.suite, gwA, gwB, *flagMetricsStates),
	); err != nil {
		return res, err
	}
	res.installed = time.Since(start)
	// The tunnel works before anything is measured.
	if !testbed.Poll(10*time.Second, 100*time.Millisecond, func() bool {
		stop := make(chan struct{})
		time.AfterFunc(300*time.Millisecond, func() { close(stop) })
		d, _ := rtts(tb.cli, 50*time.Millisecond, stop)
		return len(d) > 0
	}) {
		return res, errors.New("no echo through the tunnel")
	}
	pid := ga.proc.Pid()

	// Idle.
	idle, lost, _ := tb.probeWhile(*flagMetricsFor, func() error { return nil })
	res.idle, res.nIdle, res.lost = summarize(idle), len(idle), lost

	// Scrapes back to back, from the first one on (no warm-up: the first
	// scrape is the one that grows the heap).
	res.rss = procStatus(pid, "VmRSS")
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		tb.b.Logf("clear_refs: %v (peak RSS includes the install)", err)
	}
	busy, lost, err := tb.probeWhile(0, func() error {
		for begin := time.Now(); len(res.scrapes) == 0 || time.Since(begin) < *flagMetricsFor; {
			t := time.Now()
			w, x, err := scrapeOnce(tb.httpc, tunnelMetricsURL)
			if err != nil {
				return fmt.Errorf("scrape: %w", err)
			}
			res.scrapes = append(res.scrapes, time.Since(t))
			res.wire, res.text = w, x
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	res.growth = max(procStatus(pid, "VmHWM"), res.rss) - res.rss
	res.busy, res.nBusy, res.lost = summarize(busy), len(busy), res.lost+lost
	slices.Sort(res.scrapes)

	// One scrape a second (Prometheus scrapes every 15 s by default).
	paced, lost, err := tb.probeWhile(0, func() error {
		for begin, n := time.Now(), 0; n == 0 || time.Since(begin) < *flagMetricsFor; n++ {
			next := time.Now().Add(time.Second)
			if _, _, err := scrapeOnce(tb.httpc, tunnelMetricsURL); err != nil {
				return fmt.Errorf("scrape: %w", err)
			}
			time.Sleep(time.Until(next))
		}
		return nil
	})
	res.paced, res.nPac, res.lost = summarize(paced), len(paced), res.lost+lost
	return res, err
}

// BenchmarkMetricsTunnel measures a scrape of espd's /metrics with
// -metrics-states states installed (100,000 by default) and its effect on
// the data path: a UDP echo through the tunnel (client -> gwA -> gwB ->
// server and back, ESP-in-UDP, aes128gcm16) every -metrics-probe, first
// idle for -metrics-for, then while gwA is scraped back to back (at least
// one scrape and -metrics-for), then while it is scraped once a second
// (at least one scrape and -metrics-for). gwA runs in turn with the old
// metrics (-metrics-espd-before, if given), with --metrics-per-sa and by
// default; both gateways are restarted for each row. Per row it reports
// the median back-to-back scrape, its size on the wire (gzip, as
// Prometheus asks) and as text, espd's peak RSS growth during the
// back-to-back scrapes (VmHWM after clear_refs, less VmRSS before) and
// the echo's p50/p99 RTT in the three phases.
//
//	go test ./metrics -run XXX -bench MetricsTunnel -benchtime 1x -args -metrics-espd-before /tmp/espd-before
func BenchmarkMetricsTunnel(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	tb := &tunnelBench{b: b, dir: b.TempDir()}
	tb.bin = filepath.Join(tb.dir, "espd")
	if err := testbed.GoBuild(tb.bin, testbed.EspdPackage); err != nil {
		b.Fatal(err)
	}
	tb.top = testbed.NewT(b, testbed.Options{Prefix: "emetr"})
	var err error
	if tb.suite, err = crypto.ParseSuite("aes128gcm16"); err != nil {
		b.Fatal(err)
	}

	// The echo server on the server, the prober's socket on the client.
	server := netip.AddrPortFrom(testbed.ServerV4.Addr(), 7777)
	var srv *net.UDPConn
	if err := tb.top.Server.Do(func() (err error) {
		srv, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(server))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	go echoServer(srv)
	if err := tb.top.Client.Do(func() (err error) {
		tb.cli, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(server))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer tb.cli.Close()

	// Scrapes dial inside gwA's namespace.
	tb.httpc = &http.Client{Timeout: 300 * time.Second, Transport: &http.Transport{
		DisableCompression: true, // the request asks for gzip itself and counts the wire bytes
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := tb.top.GwA.Do(func() (err error) {
				c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}}
	defer tb.httpc.CloseIdleConnections()

	rows := []tunnelRow{
		{"per-sa", tb.bin, []string{"--metrics-per-sa", strconv.Itoa(*flagMetricsStates + 10)}},
		{"default", tb.bin, nil},
	}
	if *flagMetricsBefore != "" {
		rows = append([]tunnelRow{{"before", *flagMetricsBefore, nil}}, rows...)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("load before: %s", strings.TrimSpace(string(load)))
	for range b.N {
		for i, r := range rows {
			res, err := tb.row(i, r)
			if err != nil {
				b.Fatalf("%s: %v", r.name, err)
			}
			med := res.scrapes[len(res.scrapes)/2]
			b.Logf("%s: %d states installed in %v; %d scrapes back to back, median %v (max %v), %d bytes on the wire, %d as text; "+
				"RSS %d MB before, +%d MB peak while scraping; echo RTT µs p50/p99/max: idle %.0f/%.0f/%.0f (%d), "+
				"scraping back to back %.0f/%.0f/%.0f (%d), scraping once a second %.0f/%.0f/%.0f (%d); %d probes lost",
				r.name, *flagMetricsStates, res.installed.Round(time.Millisecond), len(res.scrapes), med.Round(time.Millisecond),
				res.scrapes[len(res.scrapes)-1].Round(time.Millisecond), res.wire, res.text, res.rss>>20, res.growth>>20,
				res.idle.p50, res.idle.p99, res.idle.max, res.nIdle, res.busy.p50, res.busy.p99, res.busy.max, res.nBusy,
				res.paced.p50, res.paced.p99, res.paced.max, res.nPac, res.lost)
			b.ReportMetric(float64(med)/1e6, r.name+"-scrape-ms")
			b.ReportMetric(float64(res.wire), r.name+"-wire-bytes")
			b.ReportMetric(float64(res.text), r.name+"-text-bytes")
			b.ReportMetric(float64(res.growth>>20), r.name+"-rss-growth-MB")
			b.ReportMetric(res.idle.p50, r.name+"-idle-p50-us")
			b.ReportMetric(res.idle.p99, r.name+"-idle-p99-us")
			b.ReportMetric(res.busy.p50, r.name+"-scraping-p50-us")
			b.ReportMetric(res.busy.p99, r.name+"-scraping-p99-us")
			b.ReportMetric(res.paced.p50, r.name+"-paced-p50-us")
			b.ReportMetric(res.paced.p99, r.name+"-paced-p99-us")
		}
	}
	load, _ = os.ReadFile("/proc/loadavg")
	b.Logf("load after: %s", strings.TrimSpace(string(load)))
}
