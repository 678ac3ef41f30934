package daemon

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/control"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/testbed"
	dto "github.com/prometheus/client_model/go"
)

// scrapeBody scrapes with get and returns the series.
func scrapeBody(t *testing.T, get func(*testing.T) string) series {
	t.Helper()
	body := get(t)
	checkExposition(t, body)
	fams, err := parseText(body)
	if err != nil {
		t.Fatal(err)
	}
	return familySeries(t, fams)
}

// familySeries flattens parsed families into series.
func familySeries(t *testing.T, fams map[string]*dto.MetricFamily) series {
	t.Helper()
	out := series{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			labels := make([]string, 0, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			key := name + "{" + strings.Join(labels, ",") + "}"
			var v float64
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			default:
				t.Errorf("%s: type %v", key, f.GetType())
			}
			if _, dup := out[key]; dup {
				t.Errorf("duplicate series %s", key)
			}
			out[key] = v
		}
	}
	return out
}

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

// TestMetricsOneSeriesPerCounter gives every counter of dataplane.Stats a
// distinct value and checks that each exported espd_dataplane_* series
// carries exactly one of them, under its own name, and that no other
// series carries any. Every counter is exported and has its help text.
func TestMetricsOneSeriesPerCounter(t *testing.T) {
	var st dataplane.Stats
	v := reflect.ValueOf(&st).Elem()
	byValue := map[float64]string{}
	for i := range v.NumField() {
		val := uint64(1_000_000 + 1000*i)
		v.Field(i).SetUint(val)
		byValue[float64(val)] = v.Type().Field(i).Name
	}
	db, err := fillDB(3)
	if err != nil {
		t.Fatal(err)
	}
	body := scrape(t, newMetrics(db, func() dataplane.Stats { return st }, 0, nil))
	fams, err := parseText(body)
	if err != nil {
		t.Fatal(err)
	}
	got := familySeries(t, fams)
	seen := map[string]string{} // field -> series
	for key, val := range got {
		field, ok := byValue[val]
		name, _, _ := strings.Cut(key, "{")
		switch {
		case !ok && strings.HasPrefix(name, "espd_dataplane_"):
			t.Errorf("%s = %v: no dataplane.Stats counter has this value", key, val)
		case !ok:
		case name != "espd_dataplane_"+snake(field)+"_total":
			t.Errorf("%s carries dataplane.Stats.%s", key, field)
		case seen[field] != "":
			t.Errorf("dataplane.Stats.%s exported twice: %s and %s", field, seen[field], key)
		default:
			seen[field] = key
		}
	}
	for i := range v.NumField() {
		f := v.Type().Field(i).Name
		if _, help := dataplaneHelp[f]; !help {
			t.Errorf("dataplane.Stats.%s has no help text (dataplaneHelp)", f)
		}
		if seen[f] == "" {
			t.Errorf("dataplane.Stats.%s is not exported", f)
		}
	}
	for f := range dataplaneHelp {
		if _, ok := v.Type().FieldByName(f); !ok {
			t.Errorf("dataplaneHelp names %s, which dataplane.Stats does not have", f)
		}
	}
	for name, f := range fams {
		if h := f.GetHelp(); h == "" || !strings.HasSuffix(h, ".") {
			t.Errorf("%s: help %q is not a sentence", name, h)
		}
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

// fakeIKE is a conn.IKE that only has counters.
type fakeIKE struct{ st conn.IKEStats }

func (f *fakeIKE) StartIKE(uint16, conn.IKEHandler) error { return nil }

func (f *fakeIKE) StopIKE() error { return nil }

func (f *fakeIKE) DeliverIKE(conn.IKEPacket) {}

func (f *fakeIKE) SendIKE(conn.IKEPacket) error { return nil }

func (f *fakeIKE) IKEPorts() (ike, natt uint16) { return 500, 4500 }

func (f *fakeIKE) IKEStats() conn.IKEStats { return f.st }

// TestMetricsIKEOneSeriesPerCounter gives every counter of conn.IKEStats
// and the hub's undelivered count a distinct value and checks that each
// espd_ike_* series carries exactly one of them, under its own name, with
// its help text; without the hand-off there is no espd_ike_* series.
func TestMetricsIKEOneSeriesPerCounter(t *testing.T) {
	db, err := fillDB(1)
	if err != nil {
		t.Fatal(err)
	}
	noDP := func() dataplane.Stats { return dataplane.Stats{} }
	if body := scrape(t, newMetrics(db, noDP, 0, nil)); strings.Contains(body, "espd_ike_") {
		t.Errorf("espd_ike_* series without the hand-off:\n%s", body)
	}

	f := &fakeIKE{}
	v := reflect.ValueOf(&f.st).Elem()
	want := map[string]float64{}
	for i := range v.NumField() {
		val := uint64(2_000_000 + 1000*i)
		v.Field(i).SetUint(val)
		want["espd_ike_"+snake(v.Type().Field(i).Name)+"_total{}"] = float64(val)
		if _, ok := ikeHelp[v.Type().Field(i).Name]; !ok {
			t.Errorf("conn.IKEStats.%s has no help text (ikeHelp)", v.Type().Field(i).Name)
		}
	}
	for name := range ikeHelp {
		if _, ok := v.Type().FieldByName(name); !ok {
			t.Errorf("ikeHelp names %s, which conn.IKEStats does not have", name)
		}
	}
	hub := &ikeHub{ike: f}
	hub.undelivered.Store(1_999_999)
	want["espd_ike_undelivered_total{}"] = 1_999_999
	m := newMetrics(db, noDP, 0, nil)
	m.reg.MustRegister(&ikeCollector{hub: hub})
	fams, err := parseText(scrape(t, m))
	if err != nil {
		t.Fatal(err)
	}
	got := familySeries(t, fams)
	for key, val := range got {
		if strings.HasPrefix(key, "espd_ike_") {
			if w, ok := want[key]; !ok || w != val {
				t.Errorf("%s = %v, want %v", key, val, w)
			}
			delete(want, key)
		} else if val >= 1_999_999 && val < 3_000_000 {
			t.Errorf("%s = %v carries an IKE counter", key, val)
		}
	}
	for key := range want {
		t.Errorf("%s is not exported", key)
	}
	for name, f := range fams {
		if h := f.GetHelp(); strings.HasPrefix(name, "espd_ike_") && (h == "" || !strings.HasSuffix(h, ".")) {
			t.Errorf("%s: help %q is not a sentence", name, h)
		}
	}
}
