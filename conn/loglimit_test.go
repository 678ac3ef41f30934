package conn

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// suppressed returns the "suppressed" attribute of each line msg (-1:
// none).
func suppressed(logs *testbed.Logs, msg string) []int64 {
	var out []int64
	for _, r := range logs.Records(msg) {
		n := int64(-1)
		if v, ok := testbed.Attr(r, "suppressed"); ok {
			n = int64(v.Uint64())
		}
		out = append(out, n)
	}
	return out
}

// TestLogLimit: a burst of lines from many goroutines logs one; the next
// line after Every says how many were held back; nothing is lost from
// the count.
func TestLogLimit(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	logs := &testbed.Logs{}
	log := logs.Logger()
	ll := &LogLimit{Every: 10 * time.Second, Now: clock}

	const goroutines, each = 8, 1000
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				ll.Warn(log, "over-long datagram", "bytes", 65500)
			}
		})
	}
	wg.Wait()
	if got := suppressed(logs, "over-long datagram"); len(got) != 1 || got[0] != 0 {
		t.Fatalf("a burst of %d lines logged %d lines (suppressed %v), want one with suppressed=0", goroutines*each, len(got), got)
	}
	advance(10*time.Second - 1)
	if ll.Warn(log, "over-long datagram") {
		t.Error("a line before Every passed was logged")
	}
	advance(1)
	if !ll.Warn(log, "over-long datagram", "bytes", 65500) {
		t.Fatal("a line after Every was held back")
	}
	got := suppressed(logs, "over-long datagram")
	if len(got) != 2 || got[1] != goroutines*each {
		t.Fatalf("second line says suppressed %v, want %d", got, goroutines*each)
	}
	last := logs.Records("over-long datagram")[1]
	if b, _ := testbed.Attr(last, "bytes"); last.Level != slog.LevelWarn || b.Int64() != 65500 || last.NumAttrs() != 2 {
		t.Errorf("line %v with %d attributes (bytes %v), want WARN with bytes=65500 and suppressed", last.Level, last.NumAttrs(), b)
	}
}

// TestLogLimitZero: the zero LogLimit logs at most once a second.
func TestLogLimitZero(t *testing.T) {
	logs := &testbed.Logs{}
	var ll LogLimit
	start := time.Now()
	for range 1000 {
		ll.Warn(logs.Logger(), "x")
	}
	elapsed := time.Since(start)
	if n := len(logs.Records("x")); n < 1 || n > 1+int(elapsed/time.Second) {
		t.Errorf("1,000 lines in %v logged %d", elapsed, n)
	}
}
