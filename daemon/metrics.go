package daemon

import (
	"net"
	"net/http"
	"time"

	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/metrics"
)

// metricsHandler serves /metrics (package metrics) over what the daemon
// runs: the databases, the data plane, the state directory's writes, and
// the IKE hand-off, the gateway pair and the AF_XDP path if it runs them.
func (d *Daemon) metricsHandler() http.Handler {
	src := metrics.Sources{
		DB:          d.db,
		Dataplane:   func() dataplane.Stats { return d.dp.Stats() },
		PerSA:       d.opts.MetricsPerSA,
		AES:         aesAccelerated(),
		StateWrites: d.writes.snapshot,
		Log:         d.log.With("component", "metrics"),
	}
	if h := d.ike.Load(); h != nil { // Run starts the hand-off first
		src.IKE = func() metrics.IKE {
			relay, undelivered := h.Stats()
			return metrics.IKE{Relay: relay, Undelivered: undelivered}
		}
	}
	if p := d.pair; p != nil {
		src.Pair = p.Metrics
	}
	if len(d.opts.IO.XDP) > 0 && d.kio != nil {
		src.XDP, src.XDPPath = true, d.kio.xdp
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.New(src))
	return mux
}

// serveMetrics starts the Prometheus endpoint.
func (d *Daemon) serveMetrics() (*http.Server, error) {
	ln, err := net.Listen("tcp", d.opts.MetricsListen)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: d.metricsHandler(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	d.log.Info("metrics listening", "addr", ln.Addr().String())
	return srv, nil
}
