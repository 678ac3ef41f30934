package metrics

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	rtmetrics "runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/sa"
)

// legacyCollector is the collector before per-state series became opt-in
// (c140e03): every series of every state, built as client_golang const
// metrics and gathered into one registry per scrape. It is kept here as
// the "before" of BenchmarkMetricsScrape.
type legacyCollector struct {
	db *sa.DB
	dp func() dataplane.Stats
}

var (
	legacySALabels = []string{"spi", "dst", "dir", "reqid", "suite"}
	legacyPackets  = prometheus.NewDesc("espd_sa_packets_total", "Packets carried by the state.", legacySALabels, nil)
	legacyBytes    = prometheus.NewDesc("espd_sa_bytes_total", "Inner bytes carried by the state.", legacySALabels, nil)
	legacyDrops    = prometheus.NewDesc("espd_sa_drops_total", "Packets of the state dropped, by reason.", append(legacySALabels[:5:5], "reason"), nil)
)

func (c *legacyCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{legacyPackets, legacyBytes, legacyDrops} {
		ch <- d
	}
	(&collector{db: c.db, dp: c.dp}).Describe(ch)
}

func (c *legacyCollector) Collect(ch chan<- prometheus.Metric) {
	counter := prometheus.CounterValue
	for _, s := range c.db.SAs() {
		st := s.Stats()
		cfg := s.Config()
		labels := []string{fmt.Sprintf("0x%08x", s.SPI()), cfg.Dst.String(), s.Dir().String(), fmt.Sprint(s.ReqID()), s.Suite().String()}
		ch <- prometheus.MustNewConstMetric(legacyPackets, counter, float64(st.Packets), labels...)
		ch <- prometheus.MustNewConstMetric(legacyBytes, counter, float64(st.Bytes), labels...)
		for r, n := range st.Drops {
			ch <- prometheus.MustNewConstMetric(legacyDrops, counter, float64(n), append(labels, sa.DropReason(r).String())...)
		}
	}
	// The series that do not depend on the number of states, as exported
	// today.
	(&collector{db: c.db, dp: c.dp}).Collect(ch)
}

// legacyHandler is the /metrics handler before (c140e03).
func legacyHandler(db *sa.DB, dp func() dataplane.Stats) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(&legacyCollector{db: db, dp: dp})
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// countingWriter is an http.ResponseWriter that counts the body.
type countingWriter struct {
	h http.Header
	n int64
}

func (w *countingWriter) Header() http.Header         { return w.h }
func (w *countingWriter) WriteHeader(int)             {}
func (w *countingWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// heapPeak samples the heap (runtime/metrics, no stop-the-world) every
// millisecond until stop is called, which returns the highest value less
// the value at the start.
func heapPeak() (stop func() uint64) {
	sample := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 { rtmetrics.Read(sample); return sample[0].Value.Uint64() }
	base := read()
	var peak atomic.Uint64
	peak.Store(base)
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			if v := read(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-finished
		return peak.Load() - base
	}
}

// churn adds and deletes one state in a loop until stop is called, which
// returns the 99th percentile and the longest of the AddSA and DeleteSA
// calls: how long a scrape can block the control socket (and any
// data-path expiry, which takes the same lock).
func churn(db *sa.DB) (stop func() (p99, worst time.Duration)) {
	suite, _ := crypto.ParseSuite("aes128gcm16")
	dst := netip.MustParseAddr("198.18.0.9")
	c := sa.Config{SPI: 0xfff00000, Suite: suite, ReqID: 7, Dir: sa.DirOut, Src: netip.MustParseAddr("198.18.0.1"), Dst: dst,
		EncKey: bytes.Repeat([]byte{0x5a}, suite.EncKeyLen())}
	// A key no state of fillDB has (they differ in their first three
	// bytes, the rest zero): AddSA refuses a key another state uses.
	for i := range c.EncKey {
		c.EncKey[i] = 0xee
	}
	var took []time.Duration
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			t := time.Now()
			if _, err := db.AddSA(c); err != nil {
				panic(err)
			}
			took = append(took, time.Since(t))
			t = time.Now()
			if err := db.DeleteSA(c.SPI, dst); err != nil {
				panic(err)
			}
			took = append(took, time.Since(t))
			time.Sleep(100 * time.Microsecond)
		}
	})
	return func() (time.Duration, time.Duration) {
		close(done)
		wg.Wait()
		if len(took) == 0 {
			return 0, 0
		}
		slices.Sort(took)
		return took[len(took)*99/100], took[len(took)-1]
	}
}

// wakeups sleeps 1 ms in a loop until stop is called, which returns the
// 99th percentile and the largest lateness of its wakeups: how long a
// data-path goroutine waiting for a packet would wait for a P.
func wakeups() (stop func() (p99, worst time.Duration)) {
	var late []time.Duration
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			due := time.Now().Add(time.Millisecond)
			time.Sleep(time.Millisecond)
			late = append(late, time.Since(due))
		}
	})
	return func() (time.Duration, time.Duration) {
		close(done)
		wg.Wait()
		if len(late) == 0 {
			return 0, 0
		}
		slices.Sort(late)
		return late[len(late)*99/100], late[len(late)-1]
	}
}

// BenchmarkMetricsScrape scrapes an in-process handler over 100,000
// states: before (the c140e03 collector, per-state series always),
// per-sa (--metrics-per-sa 100000) and default. It reports the body size
// (text-bytes, uncompressed), the heap's peak growth during a scrape
// (peak-heap-MB, sampled every ms), the 99th percentile and the longest
// of the AddSA/DeleteSA calls beside the scrapes (add-del-p99-ms,
// max-add-del-ms), how late a goroutine that sleeps 1 ms wakes
// up beside the scrapes with GOMAXPROCS 1 (wake-p99-ms, wake-max-ms; espd
// runs with half the CPUs while its readers run batches to completion,
// so 1 on two CPUs) and, with -benchmem, what a scrape allocates.
// default-allprocs is default with GOMAXPROCS left as it is, so that
// the churn runs on another CPU beside the scrape and max-add-del-ms is
// how long AddSA/DeleteSA wait for the state lock while the scrape runs.
// db-stats is sa.DB.Stats alone, which the default scrape calls once.
//
//	go test ./metrics -run XXX -bench MetricsScrape -benchmem
func BenchmarkMetricsScrape(b *testing.B) {
	db := scaleTestDB(b)
	noDP := func() dataplane.Stats { return dataplane.Stats{} }
	for _, c := range []struct {
		name     string
		h        http.Handler
		allProcs bool // keep GOMAXPROCS: the scrape and the churn run side by side
	}{
		{"before", legacyHandler(db, noDP), false},
		{"per-sa", newMetrics(db, noDP, scaleStates, nil), false},
		{"default", newMetrics(db, noDP, 0, nil), false},
		{"default-allprocs", newMetrics(db, noDP, 0, nil), true},
	} {
		b.Run(c.name, func(b *testing.B) {
			req := httptest.NewRequest("GET", "/metrics", nil)
			runtime.GC()
			if !c.allProcs {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			}
			stopChurn := churn(db)
			stopHeap := heapPeak()
			stopWake := wakeups()
			var n int64
			for b.Loop() {
				w := &countingWriter{h: http.Header{}}
				c.h.ServeHTTP(w, req)
				n = w.n
			}
			wakeP99, wakeMax := stopWake()
			peak := stopHeap()
			addDelP99, addDelMax := stopChurn()
			b.ReportMetric(float64(wakeP99)/1e6, "wake-p99-ms")
			b.ReportMetric(float64(wakeMax)/1e6, "wake-max-ms")
			b.ReportMetric(float64(n), "text-bytes")
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
			b.ReportMetric(float64(addDelP99)/1e6, "add-del-p99-ms")
			b.ReportMetric(float64(addDelMax)/1e6, "max-add-del-ms")
		})
	}
	b.Run("db-stats", func(b *testing.B) {
		for b.Loop() {
			db.Stats()
		}
	})
}
