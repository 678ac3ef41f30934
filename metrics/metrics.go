// Package metrics is espd's Prometheus endpoint (/metrics, espd
// --metrics-listen). It serves the text format (version 0.0.4) and reads
// every value from the counters the data path and the databases keep
// anyway, at scrape time: metrics cost nothing per packet.
//
// By default it exports only series whose number does not depend on the
// number of states: the SA database's (the totals over every state,
// removed ones included, acquires, lost events, the numbers of states,
// reservations and policies) and the data path's (espd_dataplane_*, from
// dataplane.Stats), with the IKE hand-off its relay's (espd_ike_*,
// ike.go), with a gateway pair the pair's (espd_pair_*, pair.go) and with
// AF_XDP the path's (espd_xdp_*, xdp.go). Each counter is exported once,
// from the one place that counts it, and its help says what increments
// it. What follows from other series is not exported: the acquires the
// rate limits held back are espd_dataplane_no_sa_total minus
// espd_acquires_total.
//
// Per-state series (espd_sa_packets_total, espd_sa_bytes_total,
// espd_sa_drops_total) are opt-in: Sources.PerSA exports them for at most
// that many states, the oldest first, and espd_metrics_states_omitted
// counts the live states the limit left out. A state has two series plus
// one per drop reason it has seen (a zero drop count is not exported per
// state; espd_drops_total has every reason). What a scrape costs at
// 100,000 states: docs/benchmarks-history.md, "Metrics at 100,000 states".
//
// Scrapes run one at a time: a scrape waits up to 10 s for the one before
// it, then gets 503. The per-state series are streamed: the label sets go
// into buffers kept from scrape to scrape and each counter is read as its
// line is written, so a scrape's heap does not grow with the number of
// series.
package metrics

import (
	"bufio"
	"compress/gzip"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/espd/espd/conn/afxdp"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/sa"
)

// scrapeWait bounds how long a scrape waits for the one running before it.
const scrapeWait = 10 * time.Second

// Sources are what the endpoint reads, each at scrape time only. DB and
// Dataplane are required; a nil optional source exports none of its
// series.
type Sources struct {
	// DB is the SA and policy database.
	DB *sa.DB
	// Dataplane returns the data path's counters.
	Dataplane func() dataplane.Stats
	// PerSA exports per-state series for at most this many states, the
	// oldest first; 0 exports none.
	PerSA int
	// AES is crypto.AESAccelerated's answer, exported as espd_cpu_aes.
	AES bool
	// StateWrites returns the failed writes of the state directory's
	// records (espd_state_write_errors_total).
	StateWrites func() StateWrites
	// IKE returns the IKE hand-off's counters (espd_ike_*), while espd
	// runs the hand-off.
	IKE func() IKE
	// Pair returns a gateway pair's state (espd_pair_*).
	Pair func() Pair
	// XDP is set when --xdp names devices (espd_xdp_*); XDPPath is their
	// AF_XDP path, nil if it could not be opened.
	XDP     bool
	XDPPath *afxdp.Path
	// Log receives the endpoint's logs; nil discards them.
	Log *slog.Logger
}

// Handler serves /metrics.
type Handler struct {
	db    *sa.DB
	perSA int // per-state series for at most this many states; 0: none
	reg   *prometheus.Registry
	log   *slog.Logger

	// scrape holds a token while a scrape runs; another waits for it up
	// to wait.
	scrape chan struct{}
	wait   time.Duration

	// Used only by the scrape holding the token.
	states  []*sa.SA      // live states with per-state series
	labels  []byte        // their label sets, one after the other
	ends    []uint32      // per state: end of "dir,dst" and end of its labels in labels
	suites  []suiteName   // names of the suites seen
	bw      *bufio.Writer // output buffer
	gz      *gzip.Writer  // compressor, if a scrape asked for gzip
	line    []byte        // scratch for a sample line
	limited bool          // whether the last scrape left states out
}

// suiteName caches crypto.Suite.String, which allocates.
type suiteName struct {
	s    crypto.Suite
	name string
}

// New returns the /metrics handler over src.
func New(src Sources) *Handler {
	log := src.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Handler{db: src.DB, perSA: max(src.PerSA, 0), reg: prometheus.NewRegistry(), log: log,
		scrape: make(chan struct{}, 1), wait: scrapeWait}
	m.reg.MustRegister(&collector{db: src.DB, dp: src.Dataplane, aes: src.AES})
	if src.StateWrites != nil {
		m.reg.MustRegister(&stateCollector{get: src.StateWrites})
	}
	if src.IKE != nil {
		m.reg.MustRegister(&ikeCollector{get: src.IKE})
	}
	if src.Pair != nil {
		m.reg.MustRegister(&pairCollector{get: src.Pair})
	}
	if src.XDP {
		m.reg.MustRegister(&xdpCollector{path: src.XDPPath})
	}
	return m
}

// ServeHTTP implements http.Handler.
func (m *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	wait := time.NewTimer(m.wait)
	select {
	case m.scrape <- struct{}{}:
		wait.Stop()
	case <-r.Context().Done():
		wait.Stop()
		return
	case <-wait.C:
		http.Error(w, "espd: another scrape is still running", http.StatusServiceUnavailable)
		return
	}
	defer func() { <-m.scrape }()

	families, err := m.reg.Gather()
	if err != nil {
		http.Error(w, "espd: gathering metrics: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	h.Add("Vary", "Accept-Encoding")
	var out io.Writer = w
	gzipped := acceptsGzip(r.Header.Get("Accept-Encoding"))
	if gzipped {
		h.Set("Content-Encoding", "gzip")
		if m.gz == nil {
			m.gz, _ = gzip.NewWriterLevel(w, gzip.BestSpeed)
		} else {
			m.gz.Reset(w)
		}
		out = m.gz
	}
	if m.bw == nil {
		m.bw = bufio.NewWriterSize(out, 32<<10)
	} else {
		m.bw.Reset(out)
	}
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(m.bw, f); err != nil {
			return // the client went away
		}
	}
	if m.perSA > 0 {
		m.writePerSA(m.bw)
	}
	if m.bw.Flush() == nil && gzipped {
		m.gz.Close()
	}
	m.bw.Reset(nil)
	if m.gz != nil {
		m.gz.Reset(io.Discard)
	}
}

// acceptsGzip reports whether an Accept-Encoding header value accepts
// gzip.
func acceptsGzip(v string) bool {
	for part := range strings.SplitSeq(v, ",") {
		coding, params, _ := strings.Cut(part, ";")
		if strings.TrimSpace(coding) != "gzip" {
			continue
		}
		q := strings.ReplaceAll(params, " ", "")
		return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
	}
	return false
}
