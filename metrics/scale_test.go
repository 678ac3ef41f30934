package metrics

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/sa"
)

// scaleStates is the number of states of the scale test and benchmarks.
const scaleStates = 100_000

var (
	scaleOnce sync.Once
	scaleDB   *sa.DB
	scaleErr  error
)

// scaleTestDB returns a database holding scaleStates states (built once
// per test binary; the tests only read it): half outbound to 198.18.0.2,
// half inbound, SPIs 0x10000 on, reqid 1000+i; every 7th state has
// carried packets and every 100th has dropped some.
func scaleTestDB(tb testing.TB) *sa.DB {
	tb.Helper()
	scaleOnce.Do(func() { scaleDB, scaleErr = fillDB(scaleStates) })
	if scaleErr != nil {
		tb.Fatal(scaleErr)
	}
	return scaleDB
}

func fillDB(n int) (*sa.DB, error) {
	suite, err := crypto.ParseSuite("aes128gcm16")
	if err != nil {
		return nil, err
	}
	db := sa.NewDB(sa.Options{})
	local, remote := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	key := bytes.Repeat([]byte{0x5a}, suite.EncKeyLen())
	for i := range n {
		c := sa.Config{SPI: uint32(0x10000 + i), Suite: suite, ReqID: uint32(1000 + i), Dir: sa.DirOut, Src: local, Dst: remote}
		if i%2 == 1 {
			c.Dir, c.Src, c.Dst, c.ReplayWindow = sa.DirIn, remote, local, 64
		}
		key[0], key[1], key[2] = byte(i), byte(i>>8), byte(i>>16)
		c.EncKey = key
		s, err := db.AddSA(c)
		if err != nil {
			return nil, err
		}
		if i%7 == 0 {
			s.Account(uint64(i), uint64(100*i))
		}
		if i%100 == 0 {
			s.Drop(sa.DropReplay, 3)
			s.Drop(sa.DropIntegrity, 1)
		}
	}
	return db, nil
}

// TestMetricsScale: with 100,000 states the default scrape is small, has
// no per-state series and the right totals; --metrics-per-sa adds the
// per-state series, limited to the oldest N states.
func TestMetricsScale(t *testing.T) {
	db := scaleTestDB(t)
	noDP := func() dataplane.Stats { return dataplane.Stats{} }
	var wantPackets, wantBytes uint64
	for i := 0; i < scaleStates; i += 7 {
		wantPackets += uint64(i)
		wantBytes += uint64(100 * i)
	}
	withDrops := (scaleStates + 99) / 100

	body := scrape(t, newMetrics(db, noDP, 0, nil))
	if len(body) > 64<<10 {
		t.Errorf("default scrape of %d states is %d bytes, want at most 64 KiB", scaleStates, len(body))
	}
	if n := countPrefix(body, "espd_sa_"); n != 0 {
		t.Errorf("default scrape has %d per-state lines (espd_sa_*), want none", n)
	}
	if strings.Contains(body, "espd_metrics_states_omitted") {
		t.Error("default scrape exports espd_metrics_states_omitted, which can only move with --metrics-per-sa")
	}
	for series, want := range map[string]uint64{
		"espd_states":                          scaleStates,
		"espd_packets_total":                   wantPackets,
		"espd_bytes_total":                     wantBytes,
		`espd_drops_total{reason="replay"}`:    3 * uint64(withDrops),
		`espd_drops_total{reason="integrity"}`: uint64(withDrops),
		`espd_drops_total{reason="padding"}`:   0,
	} {
		if got := sampleValue(t, body, series); got != want {
			t.Errorf("%s = %d, want %d", series, got, want)
		}
	}
	t.Logf("default scrape of %d states: %d bytes", scaleStates, len(body))

	body = scrape(t, newMetrics(db, noDP, scaleStates, nil))
	for prefix, want := range map[string]int{
		"espd_sa_packets_total{": scaleStates,
		"espd_sa_bytes_total{":   scaleStates,
		"espd_sa_drops_total{":   2 * withDrops,
		"# TYPE espd_sa_":        3,
	} {
		if n := countPrefix(body, prefix); n != want {
			t.Errorf("per-state scrape: %d lines %s..., want %d", n, prefix, want)
		}
	}
	for series, want := range map[string]uint64{
		`espd_sa_packets_total{dir="out",dst="198.18.0.2",reqid="1014",spi="0x0001000e",suite="aes128gcm16"}`:                  14,
		`espd_sa_bytes_total{dir="in",dst="198.18.0.1",reqid="1021",spi="0x00010015",suite="aes128gcm16"}`:                     2100,
		`espd_sa_packets_total{dir="in",dst="198.18.0.1",reqid="1001",spi="0x00010001",suite="aes128gcm16"}`:                   0,
		`espd_sa_drops_total{dir="out",dst="198.18.0.2",reason="replay",reqid="1100",spi="0x00010064",suite="aes128gcm16"}`:    3,
		`espd_sa_drops_total{dir="out",dst="198.18.0.2",reason="integrity",reqid="1000",spi="0x00010000",suite="aes128gcm16"}`: 1,
		"espd_metrics_states_omitted": 0,
		"espd_states":                 scaleStates,
	} {
		if got := sampleValue(t, body, series); got != want {
			t.Errorf("%s = %d, want %d", series, got, want)
		}
	}
	t.Logf("per-state scrape of %d states: %d bytes", scaleStates, len(body))

	const limit = 1000
	body = scrape(t, newMetrics(db, noDP, limit, nil))
	if n := countPrefix(body, "espd_sa_packets_total{"); n != limit {
		t.Errorf("--metrics-per-sa %d: %d states have series", limit, n)
	}
	if got := sampleValue(t, body, "espd_metrics_states_omitted"); got != scaleStates-limit {
		t.Errorf("espd_metrics_states_omitted = %d, want %d", got, scaleStates-limit)
	}
	// The oldest states are the ones kept.
	if !strings.Contains(body, `spi="0x00010000"`) || !strings.Contains(body, `spi="0x000103e7"`) || strings.Contains(body, `spi="0x000103e8"`) {
		t.Errorf("--metrics-per-sa %d did not keep the %d oldest states", limit, limit)
	}
}

// TestMetricsPerSAAfterDelete: a removed state leaves the per-state series
// at the next scrape, and its counters stay in the totals.
func TestMetricsPerSAAfterDelete(t *testing.T) {
	db, err := fillDB(10)
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics(db, func() dataplane.Stats { return dataplane.Stats{} }, 100, nil)
	if err := db.DeleteSA(0x10007, netip.MustParseAddr("198.18.0.1")); err != nil {
		t.Fatal(err)
	}
	body := scrape(t, m)
	if strings.Contains(body, `spi="0x00010007"`) {
		t.Error("a deleted state still has per-state series")
	}
	if n := countPrefix(body, "espd_sa_packets_total{"); n != 9 {
		t.Errorf("%d states with series, want 9", n)
	}
	if got := sampleValue(t, body, "espd_packets_total"); got != 7 {
		t.Errorf("espd_packets_total = %d, want 7 (the deleted state's included)", got)
	}
}

// TestMetricsOneScrapeAtATime: a scrape waits while another runs, and
// gets 503 if that one takes longer than the wait.
func TestMetricsOneScrapeAtATime(t *testing.T) {
	db, err := fillDB(3)
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics(db, func() dataplane.Stats { return dataplane.Stats{} }, 0, nil)
	// Long enough that the waiting scrape never gives up here, however
	// slowly a loaded machine schedules this test.
	m.wait = time.Minute
	m.scrape <- struct{}{} // a scrape is running

	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		m.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		done <- rec
	}()
	select {
	case rec := <-done:
		t.Fatalf("a second scrape ran beside the first: status %d", rec.Code)
	case <-time.After(50 * time.Millisecond):
	}
	<-m.scrape // the first one ends
	select {
	case rec := <-done:
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "espd_states 3") {
			t.Errorf("the waiting scrape: status %d\n%s", rec.Code, rec.Body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting scrape did not run after the first ended")
	}

	m.wait = 200 * time.Millisecond
	m.scrape <- struct{}{}
	rec := httptest.NewRecorder()
	start := time.Now()
	m.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("a scrape behind one that does not end: status %d, want 503", rec.Code)
	}
	if d := time.Since(start); d < m.wait {
		t.Errorf("it gave up after %v, before the wait of %v", d, m.wait)
	}
	<-m.scrape

	// A client that gives up while waiting leaves at once.
	m.wait = time.Minute
	m.scrape <- struct{}{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	rec = httptest.NewRecorder()
	m.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil).WithContext(ctx))
	if rec.Body.Len() != 0 {
		t.Errorf("a cancelled scrape wrote %q", rec.Body)
	}
	<-m.scrape
}

// TestMetricsGzip: a client that accepts gzip gets the same body
// compressed.
func TestMetricsGzip(t *testing.T) {
	db, err := fillDB(20)
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics(db, func() dataplane.Stats { return dataplane.Stats{} }, 100, nil)
	plain := scrape(t, m)
	for _, ae := range []string{"gzip", "deflate, gzip;q=1.0, *;q=0.5", "gzip, identity"} {
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Accept-Encoding", ae)
		rec := httptest.NewRecorder()
		m.ServeHTTP(rec, req)
		if rec.Header().Get("Content-Encoding") != "gzip" {
			t.Fatalf("Accept-Encoding %q: not compressed", ae)
		}
		got, err := gunzip(rec.Body.Bytes())
		if err != nil {
			t.Fatalf("Accept-Encoding %q: %v", ae, err)
		}
		if got != plain {
			t.Errorf("Accept-Encoding %q: the compressed body differs from the plain one", ae)
		}
	}
	for _, ae := range []string{"", "identity", "gzip;q=0", "deflate"} {
		if acceptsGzip(ae) {
			t.Errorf("acceptsGzip(%q) = true", ae)
		}
	}
}

// gunzip decompresses b.
func gunzip(b []byte) (string, error) {
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return "", err
	}
	out, err := io.ReadAll(r)
	return string(out), err
}
