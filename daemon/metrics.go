package daemon

import (
	"bufio"
	"compress/gzip"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/sa"
)

// The metrics endpoint (Options.MetricsListen, /metrics) serves the
// Prometheus text format (version 0.0.4). Every value is read from the
// counters the data path keeps anyway, at scrape time: metrics cost
// nothing per packet.
//
// By default it exports only series whose number does not depend on the
// number of states: the SA database's (the totals over every state,
// removed ones included, acquires, lost events, the numbers of states,
// reservations and policies) and the data path's (espd_dataplane_*, from
// dataplane.Stats), with the IKE hand-off its relay's (espd_ike_*,
// metrics_ike.go) and with a gateway pair the pair's (espd_pair_*,
// metrics_pair.go): about 55 series in 8 KB, the same with 10 states or
// 100,000. Each counter is exported once, from the one place that counts
// it, and its help says what increments it (metrics_series_test.go
// checks both, and that every series moves). What follows from other
// series is not exported: the acquires the rate limits held back are
// espd_dataplane_no_sa_total minus espd_acquires_total. Per-state series (espd_sa_packets_total, espd_sa_bytes_total,
// espd_sa_drops_total) are opt-in: Options.MetricsPerSA (espd
// --metrics-per-sa N) exports them for at most N states, the oldest
// first, and espd_metrics_states_omitted counts the live states the limit
// left out. A state has two series plus one per drop reason it has seen
// (a zero drop count is not exported per state; espd_drops_total has
// every reason), about 100 bytes each: 100,000 states make a scrape of
// about 20 MB, which Prometheus then stores as 200,000 series.
//
// Scrapes run one at a time: a scrape waits up to scrapeWait for the one
// before it, then gets 503. The per-state series are streamed: the
// label sets go into buffers kept from scrape to scrape and each counter
// is read as its line is written, so a scrape's heap does not grow with
// the number of series.

// scrapeWait bounds how long a scrape waits for the one running before it.
const scrapeWait = 10 * time.Second

// metricsHandler serves /metrics.
func (d *Daemon) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	m := newMetrics(d.db, d.dp.Stats, d.opts.MetricsPerSA, d.log.With("component", "metrics"))
	m.reg.MustRegister(&stateCollector{w: &d.writes})
	if h := d.ike.Load(); h != nil { // Run starts the hand-off first
		m.reg.MustRegister(&ikeCollector{hub: h})
	}
	if d.pair != nil {
		m.reg.MustRegister(&pairCollector{p: d.pair})
	}
	if len(d.opts.IO.XDP) > 0 && d.kio != nil {
		m.reg.MustRegister(&xdpCollector{path: d.kio.xdp})
	}
	mux.Handle("/metrics", m)
	return mux
}

// metrics is the /metrics handler.
type metrics struct {
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

// newMetrics returns the /metrics handler over db and the data plane's
// counters, with per-state series for at most perSA states.
func newMetrics(db *sa.DB, dp func() dataplane.Stats, perSA int, log *slog.Logger) *metrics {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &metrics{db: db, perSA: max(perSA, 0), reg: prometheus.NewRegistry(), log: log,
		scrape: make(chan struct{}, 1), wait: scrapeWait}
	m.reg.MustRegister(&collector{db: db, dp: dp, aes: aesAccelerated()})
	return m
}

// ServeHTTP implements http.Handler.
func (m *metrics) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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

// Per-state families.
const (
	helpSAPackets = "# HELP espd_sa_packets_total Packets carried by the state.\n# TYPE espd_sa_packets_total counter\n"
	helpSABytes   = "# HELP espd_sa_bytes_total Inner bytes carried by the state.\n# TYPE espd_sa_bytes_total counter\n"
	helpSADrops   = "# HELP espd_sa_drops_total Packets of the state dropped, by reason (only reasons that dropped a packet of the state).\n# TYPE espd_sa_drops_total counter\n"
	helpOmitted   = "# HELP espd_metrics_states_omitted Live states without espd_sa_* series because of the per-state limit (--metrics-per-sa).\n# TYPE espd_metrics_states_omitted gauge\n"
)

// writePerSA writes the per-state families for the oldest m.perSA live
// states, and espd_metrics_states_omitted. The label sets are formatted
// once, into buffers kept from scrape to scrape; the counters are read
// as each line is written.
func (m *metrics) writePerSA(w *bufio.Writer) {
	all := m.db.SAs() // oldest first
	live := m.states[:0]
	for _, s := range all {
		if st := s.State(); st == sa.StateValid || st == sa.StateSoftExpired {
			live = append(live, s)
		}
	}
	omitted := max(len(live)-m.perSA, 0)
	live = live[:len(live)-omitted]
	if limited := omitted > 0; limited != m.limited {
		m.limited = limited
		if limited {
			m.log.Warn("per-state metrics limited: some states have no espd_sa_* series", "limit", m.perSA, "omitted", omitted)
		} else {
			m.log.Info("per-state metrics no longer limited", "limit", m.perSA, "states", len(live))
		}
	}

	m.labels, m.ends = m.labels[:0], m.ends[:0]
	for i, s := range live {
		m.labels, m.ends = m.appendLabels(m.labels, m.ends, s)
		yield(i)
	}

	w.WriteString(helpSAPackets)
	for i, s := range live {
		m.sample(w, "espd_sa_packets_total{", i, "", s.Stats().Packets)
		yield(i)
	}
	w.WriteString(helpSABytes)
	for i, s := range live {
		m.sample(w, "espd_sa_bytes_total{", i, "", s.Stats().Bytes)
		yield(i)
	}
	w.WriteString(helpSADrops)
	for i, s := range live {
		yield(i)
		st := s.Stats()
		for r, n := range st.Drops {
			if n != 0 {
				m.sample(w, "espd_sa_drops_total{", i, sa.DropReason(r).String(), n)
			}
		}
	}
	w.WriteString(helpOmitted)
	w.WriteString("espd_metrics_states_omitted ")
	m.line = strconv.AppendInt(m.line[:0], int64(omitted), 10)
	m.line = append(m.line, '\n')
	w.Write(m.line)

	// Keep the buffers for the next scrape, unless they are far larger
	// than this one needed; drop the pointers to the states.
	clear(live)
	m.states = live[:0]
	if cap(m.states) > 4*len(live)+1024 {
		m.states, m.labels, m.ends = nil, nil, nil
	}
}

// yieldEvery is how many states a per-state loop handles before it lets
// other goroutines run.
const yieldEvery = 256

// yield lets the data path's goroutines run every yieldEvery states: they
// share espd's Ps (GOMAXPROCS may be 1) with the scrape, and Go would
// otherwise preempt a busy scrape only every 10 ms. With its gzip
// compression (inline in the writes), a chunk takes well under a
// millisecond.
func yield(i int) {
	if i%yieldEvery == yieldEvery-1 {
		runtime.Gosched()
	}
}

// sample writes one sample line of the i-th state: name (ending in "{"),
// its labels, reason if not empty, value.
func (m *metrics) sample(w *bufio.Writer, name string, i int, reason string, v uint64) {
	start := uint32(0)
	if i > 0 {
		start = m.ends[2*i-1]
	}
	mid, end := m.ends[2*i], m.ends[2*i+1]
	b := append(m.line[:0], name...)
	if reason == "" {
		b = append(b, m.labels[start:end]...)
	} else {
		b = append(b, m.labels[start:mid]...)
		b = append(b, `,reason="`...)
		b = append(b, reason...)
		b = append(b, '"')
		b = append(b, m.labels[mid:end]...)
	}
	b = append(b, "} "...)
	b = strconv.AppendUint(b, v, 10)
	b = append(b, '\n')
	w.Write(b)
	m.line = b
}

// appendLabels appends the label set of s (names sorted, as the client
// library writes them), and the ends of its two halves, around where
// reason goes.
func (m *metrics) appendLabels(b []byte, ends []uint32, s *sa.SA) ([]byte, []uint32) {
	b = append(b, `dir="`...)
	b = appendLabelValue(b, s.Dir().String())
	b = append(b, `",dst="`...)
	b = s.Config().Dst.AppendTo(b)
	b = append(b, '"')
	ends = append(ends, uint32(len(b)))
	b = append(b, `,reqid="`...)
	b = strconv.AppendUint(b, uint64(s.ReqID()), 10)
	b = append(b, `",spi="0x`...)
	spi := s.SPI()
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, "0123456789abcdef"[spi>>shift&0xf])
	}
	b = append(b, `",suite="`...)
	b = appendLabelValue(b, m.suiteName(s.Suite()))
	b = append(b, '"')
	return b, append(ends, uint32(len(b)))
}

// suiteName returns s.String(), cached.
func (m *metrics) suiteName(s crypto.Suite) string {
	for _, n := range m.suites {
		if n.s == s {
			return n.name
		}
	}
	if len(m.suites) >= 64 {
		m.suites = m.suites[:0]
	}
	n := suiteName{s, s.String()}
	m.suites = append(m.suites, n)
	return n.name
}

// appendLabelValue appends v escaped for a label value of the text
// format.
func appendLabelValue(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			b = append(b, `\\`...)
		case '"':
			b = append(b, `\"`...)
		case '\n':
			b = append(b, `\n`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// collector exports the series whose number does not depend on the number
// of states: the SA database's (sa.GlobalStats) and the data path's
// (dataplane.Stats). Each counter is exported once, from the one place
// that counts it.
type collector struct {
	db  *sa.DB
	dp  func() dataplane.Stats
	aes bool // crypto.AESAccelerated, when the daemon started
}

// The SA database's series (sa.DB.Stats).
var (
	descStates = prometheus.NewDesc("espd_states",
		"States (SAs) installed now; SPI reservations are espd_spi_reservations.", nil, nil)
	descReserved = prometheus.NewDesc("espd_spi_reservations",
		"SPIs reserved by SPI_ALLOC (espctl spi alloc) that no state uses yet.", nil, nil)
	descPolicies = prometheus.NewDesc("espd_policies", "Policies installed now.", nil, nil)
	descPackets  = prometheus.NewDesc("espd_packets_total",
		"Packets states carried (encapsulated and handed to the sockets, or decapsulated and handed to the TUN), summed over every state, removed ones included.", nil, nil)
	descBytes = prometheus.NewDesc("espd_bytes_total",
		"Inner bytes of the packets in espd_packets_total.", nil, nil)
	descDrops = prometheus.NewDesc("espd_drops_total",
		"Packets a state dropped, by reason, summed over every state, removed ones included (the data path's drops before a state is found are espd_dataplane_*).", []string{"reason"}, nil)
	descAcquires = prometheus.NewDesc("espd_acquires_total",
		"Acquire events published: an outbound packet matched a protect policy whose reqid had no live state, and the rate limits (one per policy and destination a second, 100 a second in all) let the event through (each such packet is in espd_dataplane_no_sa_total: the difference is what the rate limits held back).", nil, nil)
	descCPUAES = prometheus.NewDesc("espd_cpu_aes",
		"1 if the CPU has the AES instructions Go's AES uses, 0 if AES suites run slowly and not in constant time here.", nil, nil)
	descEventsDropped = prometheus.NewDesc("espd_events_dropped_total",
		"Events (expiries, acquires, NAT mapping changes) not delivered to a control subscriber because its buffer was full, one per event and subscriber.", nil, nil)
)

// dataplaneHelp says what increments each dataplane.Stats counter,
// exported as espd_dataplane_<name>_total (snake case).
var dataplaneHelp = map[string]string{
	"TUNRxPackets":     "Packets read from the TUN (each packet of a super-packet counts).",
	"TUNRxBytes":       "Bytes of the packets in espd_dataplane_tun_rx_packets_total.",
	"TUNTxPackets":     "Packets handed to the TUN: decapsulated packets and the ICMP errors the data path writes.",
	"TUNTxBytes":       "Bytes of the packets in espd_dataplane_tun_tx_packets_total.",
	"TUNQueueDrops":    "Packets the kernel routed into the TUN and dropped because its transmit queue (--tun-txqueuelen) was full: espd had not read them yet (the interface's tx_dropped).",
	"RxPackets":        "Outer packets received from the sockets (ESP, ESP-in-UDP, NAT-keepalives, IKE, malformed).",
	"RxBytes":          "ESP (or UDP payload) bytes of the outer packets received that could be read.",
	"TxPackets":        "Outer packets handed to the sockets, each fragment and NAT-keepalive included.",
	"TxBytes":          "Bytes of the packets in espd_dataplane_tx_packets_total, IP headers included.",
	"NoPolicy":         "Outbound packets no outbound policy matches (dropped).",
	"BypassInTUN":      "Outbound packets a bypass policy matches, dropped: bypass does not apply inside the TUN.",
	"PolicyDrops":      "Outbound packets an outbound drop policy matches (dropped).",
	"NoSA":             "Outbound packets a protect policy matches while its reqid has no live state (dropped; each asks for an acquire).",
	"ICMPSent":         "ICMP fragmentation-needed or packet-too-big errors written to the TUN for packets too big for the path.",
	"ICMPLimited":      "ICMP errors for packets too big for the path that the rate limit suppressed.",
	"Fragments":        "Outer fragments sent (an outer packet split in k counts k).",
	"InvalidSPI":       "Inbound ESP packets whose SPI no live inbound state has (dropped).",
	"Malformed":        "Outer packets, or packets read from the TUN, that cannot be parsed far enough to find their state or policy (dropped).",
	"KeepalivesRx":     "NAT-keepalives received (and dropped).",
	"KeepalivesTx":     "NAT-keepalives sent.",
	"IKE":              "Non-ESP (IKE) datagrams received on the encapsulation port.",
	"NoInterface":      "Inbound packets of a state whose interface ID (if_id) has no route-based interface (dropped before decryption).",
	"QueueDrops":       "Packets dropped because the workers' queue was full.",
	"SendErrors":       "Outer packets the kernel refused to send.",
	"TUNWriteErrors":   "Writes to the TUN (of a batch of packets, or of one ICMP error) that failed.",
	"ReadErrors":       "Reads from the TUN or the outer sockets that failed.",
	"TUNReads":         "Successful read(2) calls on the TUN.",
	"TUNSuperReads":    "TUN reads that returned a TSO/USO super-packet.",
	"TUNWrites":        "Writes of packets and coalesced super-packets to the TUN, each one writev(2) or one io_uring submission (a Write of several takes one io_uring_enter).",
	"TUNUringEnters":   "io_uring_enter calls through which the TUN writes of a batch were submitted together (none with --tun-no-uring or where io_uring is refused).",
	"TUNSuperWrites":   "TUN writes of a coalesced super-packet.",
	"RecvCalls":        "recvmmsg calls on the outer sockets that returned datagrams.",
	"RecvDatagrams":    "Datagrams those recvmmsg calls returned (a UDP_GRO datagram counts once).",
	"SendCalls":        "sendmmsg calls on the outer sockets that sent messages.",
	"SendMessages":     "Messages those sendmmsg calls sent (a UDP_SEGMENT message counts once).",
	"CompletedBatches": "Batches a reader ran to completion itself.",
	"HandedOff":        "Batches a reader handed to the workers.",
}

// dpSeries is one exported counter of a struct of counters
// (dataplane.Stats, conn.IKEStats).
type dpSeries struct {
	field int // index in the struct
	desc  *prometheus.Desc
}

var dpFields = counterFields[dataplane.Stats]("espd_dataplane_", dataplaneHelp)

// counterFields describes the counters of the struct T as
// <prefix><name>_total, with the help texts of help by field name. A
// counter without help is exported with its Go name as help; the tests
// fail on it.
func counterFields[T any](prefix string, help map[string]string) []dpSeries {
	t := reflect.TypeFor[T]()
	var out []dpSeries
	for i := range t.NumField() {
		f := t.Field(i)
		h, ok := help[f.Name]
		if !ok {
			h = t.String() + "." + f.Name
		}
		out = append(out, dpSeries{i, prometheus.NewDesc(prefix+snake(f.Name)+"_total", h, nil, nil)})
	}
	return out
}

// snake turns "TUNRxPackets" into "tun_rx_packets".
func snake(s string) string {
	var b strings.Builder
	r := []rune(s)
	for i, c := range r {
		if unicode.IsUpper(c) && i > 0 && (unicode.IsLower(r[i-1]) || (i+1 < len(r) && unicode.IsLower(r[i+1]))) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descStates, descReserved, descPolicies, descPackets, descBytes, descDrops,
		descAcquires, descEventsDropped, descCPUAES} {
		ch <- d
	}
	for _, f := range dpFields {
		ch <- f.desc
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	counter, gauge := prometheus.CounterValue, prometheus.GaugeValue
	g := c.db.Stats()
	ch <- prometheus.MustNewConstMetric(descStates, gauge, float64(g.States))
	ch <- prometheus.MustNewConstMetric(descReserved, gauge, float64(g.Larval))
	ch <- prometheus.MustNewConstMetric(descPolicies, gauge, float64(g.Policies))
	ch <- prometheus.MustNewConstMetric(descPackets, counter, float64(g.Packets))
	ch <- prometheus.MustNewConstMetric(descBytes, counter, float64(g.Bytes))
	for r, n := range g.Drops {
		ch <- prometheus.MustNewConstMetric(descDrops, counter, float64(n), sa.DropReason(r).String())
	}
	ch <- prometheus.MustNewConstMetric(descAcquires, counter, float64(g.Acquires))
	ch <- prometheus.MustNewConstMetric(descEventsDropped, counter, float64(g.EventsDropped))
	aes := 0.0
	if c.aes {
		aes = 1
	}
	ch <- prometheus.MustNewConstMetric(descCPUAES, gauge, aes)
	dv := reflect.ValueOf(c.dp())
	for _, f := range dpFields {
		ch <- prometheus.MustNewConstMetric(f.desc, counter, float64(dv.Field(f.field).Uint()))
	}
}
