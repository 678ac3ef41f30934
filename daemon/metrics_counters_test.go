package daemon

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/metrics"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
)

// checkMovedElsewhere checks movedElsewhere against what is exported and
// against the tests it names.
func checkMovedElsewhere(t *testing.T, exported map[string]bool) {
	t.Helper()
	for name := range unproven {
		if !exported[name] {
			t.Errorf("unproven lists %s, which is not exported", name)
		}
		if _, ok := movedElsewhere[name]; ok {
			t.Errorf("%s is both in unproven and in movedElsewhere", name)
		}
	}
	for name := range movedElsewhere {
		if !exported[name] && optionTest(name) == "" {
			t.Errorf("movedElsewhere lists %s, which is not exported", name)
		}
		checkMovedEntry(t, name)
	}
}

// optionTest returns the test that checks the series name, exported only
// with an option (withOption), against movedElsewhere; "" for another.
func optionTest(name string) string {
	for prefix, test := range withOption {
		if strings.HasPrefix(name, prefix) {
			return test
		}
	}
	return ""
}

// checkMovedEntry checks that the test movedElsewhere names for the series
// exists and reads its counter.
func checkMovedEntry(t *testing.T, name string) {
	t.Helper()
	e, ok := movedElsewhere[name]
	if !ok {
		t.Errorf("%s is not in movedElsewhere", name)
		return
	}
	src, err := os.ReadFile(filepath.Join("..", e.file))
	if err != nil {
		t.Errorf("%s: %v", name, err)
		return
	}
	if !strings.Contains(string(src), "func "+e.test+"(t *testing.T)") {
		t.Errorf("%s: %s has no %s", name, e.file, e.test)
	}
	if !strings.Contains(string(src), "."+e.reference) {
		t.Errorf("%s: %s does not read %s", name, e.file, e.reference)
	}
}

// startPeer runs a daemon in ns, NAT-keepalives every
// 100 ms, until the test ends.
func startPeer(t *testing.T, ns *testbed.Node) *Daemon {
	t.Helper()
	d, err := New(Options{
		Dataplane:     dataplane.Config{Keepalive: 100 * time.Millisecond},
		Control:       control.ServerConfig{Path: filepath.Join(t.TempDir(), "peer.sock")},
		MetricsListen: metricsAddr, // in its own namespace
	})
	if err != nil {
		t.Fatal(err)
	}
	run := runIn(t, ns, d, nil)
	// Run has started the data path when the metrics endpoint listens.
	deadline := time.Now().Add(10 * time.Second)
	for ns.Do(func() error {
		c, err := net.DialTimeout("tcp", metricsAddr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}) != nil {
		if gone, err := run.exited(); gone {
			t.Fatalf("peer exited at start: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("peer not running within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return d
}

// TestMetricsPairListed holds the gateway pair's series, which
// TestMetricsSeries's daemon (without a pair) does not export, to
// movedElsewhere: each is there under gwpair's TestMetricsPair, which
// moves them all, and each entry there for a pair's series is exported.
func TestMetricsPairListed(t *testing.T) {
	m := metrics.New(metrics.Sources{DB: sa.NewDB(sa.Options{}), Dataplane: func() dataplane.Stats { return dataplane.Stats{} },
		Pair: func() metrics.Pair { return metrics.Pair{HeardOK: true} }})
	exported := map[string]bool{}
	for key := range scrapeBody(t, func(t *testing.T) string { return scrape(t, m) }) {
		if name, _, _ := strings.Cut(key, "{"); strings.HasPrefix(name, "espd_pair_") {
			exported[name] = true
		}
	}
	if len(exported) == 0 {
		t.Fatal("no espd_pair_* series with a pair")
	}
	for name := range exported {
		if e := movedElsewhere[name]; e.test != "TestMetricsPair" || e.file != pairTestFile {
			t.Errorf("%s: movedElsewhere names %q in %q, want TestMetricsPair", name, e.test, e.file)
		}
		checkMovedEntry(t, name)
	}
	for name := range movedElsewhere {
		if optionTest(name) == "TestMetricsPair" && !exported[name] {
			t.Errorf("movedElsewhere lists %s, which a pair does not export", name)
		}
	}
}
