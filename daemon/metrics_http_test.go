package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
)

// metricsAddr is where the endpoint listens, inside the test's own
// namespace.
const metricsAddr = "127.0.0.1:9585"

// startWithMetrics runs a daemon with the metrics endpoint in a fresh
// namespace, as Run does for espd --metrics-listen, and returns it with
// an HTTP client that dials inside the namespace.
func startWithMetrics(t *testing.T, perSA int) (*Daemon, *http.Client) {
	t.Helper()
	d, c, _ := startMetricsDaemon(t, Options{Dataplane: dataplane.Config{Keepalive: -1}, MetricsPerSA: perSA})
	return d, c
}

// startMetricsDaemon is startWithMetrics with the given options (the
// control socket and the metrics address are set here), and also returns
// the namespace.
func startMetricsDaemon(t *testing.T, opts Options) (*Daemon, *http.Client, *testbed.Node) {
	t.Helper()
	ns := testbed.NewNodeT(t, "metrics")
	opts.Control = control.ServerConfig{Path: filepath.Join(t.TempDir(), "espd.sock")}
	opts.MetricsListen = metricsAddr
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	run := runIn(t, ns, d, nil)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := ns.Do(func() error {
			var err error
			c, err = (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	client := &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := dial(context.Background(), "tcp", metricsAddr)
		if err == nil {
			c.Close()
			return d, client, ns
		}
		if gone, err := run.exited(); gone {
			t.Fatalf("daemon exited at start: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics endpoint not listening within 10 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get scrapes the endpoint and returns the (decompressed) body.
func get(t *testing.T, c *http.Client) string {
	t.Helper()
	resp, err := c.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s: %s", resp.Status, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type %q", ct)
	}
	if !resp.Uncompressed {
		t.Error("the endpoint did not compress for a client that accepts gzip")
	}
	return string(b)
}

// addStates installs n states in d's database, some with traffic and
// drops.
func addStates(t *testing.T, d *Daemon, n int) {
	t.Helper()
	suites := []string{"aes128gcm16", "chacha20poly1305", "aes256gcm16-esn"}
	for i := range n {
		suite, err := crypto.ParseSuite(suites[i%len(suites)])
		if err != nil {
			t.Fatal(err)
		}
		c := sa.Config{SPI: uint32(0x2000 + i), Suite: suite, ReqID: uint32(10 + i%4), Dir: sa.DirOut,
			Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr(fmt.Sprintf("198.18.0.%d", 2+i%3))}
		if i%2 == 1 {
			c.Dir, c.Src, c.Dst, c.ReplayWindow = sa.DirIn, c.Dst, c.Src, 64
		}
		c.EncKey = bytes.Repeat([]byte{0x5a}, suite.EncKeyLen())
		c.EncKey[0] ^= byte(i)
		s, err := d.DB().AddSA(c)
		if err != nil {
			t.Fatal(err)
		}
		s.Account(uint64(i), uint64(64*i))
		s.Drop(sa.DropReason(i%int(sa.NumDropReasons)), 1)
	}
}

// TestMetricsEndpoint scrapes the HTTP endpoint of a running daemon, by
// default and with per-state series: the body parses as the Prometheus
// text format and has no duplicate series.
func TestMetricsEndpoint(t *testing.T) {
	for _, perSA := range []int{0, 1000} {
		t.Run(fmt.Sprintf("per-sa=%d", perSA), func(t *testing.T) {
			d, c := startWithMetrics(t, perSA)
			const states = 30
			addStates(t, d, states)
			body := get(t, c)
			n := checkExposition(t, body)
			fams, err := parseText(body)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"espd_states", "espd_policies", "espd_packets_total", "espd_bytes_total", "espd_drops_total",
				"espd_dataplane_invalid_spi_total", "espd_dataplane_tun_rx_packets_total"} {
				if fams[f] == nil {
					t.Errorf("no family %s", f)
				}
			}
			if got := fams["espd_states"].GetMetric()[0].GetGauge().GetValue(); got != states {
				t.Errorf("espd_states = %v, want %d", got, states)
			}
			if got := len(fams["espd_drops_total"].GetMetric()); got != int(sa.NumDropReasons) {
				t.Errorf("espd_drops_total has %d reasons, want %d", got, sa.NumDropReasons)
			}
			perState := 0
			for _, f := range perSAFamilies {
				if fam := fams[f]; fam != nil {
					perState += len(fam.GetMetric())
				}
			}
			switch {
			case perSA == 0 && perState != 0:
				t.Errorf("default endpoint has %d per-state series", perState)
			case perSA > 0:
				// Two per state, one per drop reason seen, and the omitted gauge.
				if want := 3*states + 1; perState != want {
					t.Errorf("%d per-state series, want %d", perState, want)
				}
				if f := fams["espd_sa_packets_total"]; f == nil || f.GetType() != dto.MetricType_COUNTER {
					t.Error("espd_sa_packets_total is not a counter")
				}
			}
			t.Logf("%d series, %d bytes", n, len(body))
		})
	}
}
