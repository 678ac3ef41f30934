// Package metricstest holds the checks of a /metrics scrape that the tests
// of metrics and daemon share: serving one scrape, parsing it as
// Prometheus does, and the exposition rules every body must keep.
package metricstest

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// PerSAFamilies are the families of the per-state series
// (metrics.Sources.PerSA), which the handler writes outside its registry.
var PerSAFamilies = []string{"espd_sa_packets_total", "espd_sa_bytes_total", "espd_sa_drops_total", "espd_metrics_states_omitted"}

// Series is a scrape: the value of each series, by name and sorted labels
// (`name{a="x",b="y"}`).
type Series map[string]float64

// Scrape serves one GET /metrics of h and returns the body; it fails the
// test on a status other than 200 or a Content-Type other than the text
// format 0.0.4.
func Scrape(t testing.TB, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: status %d: %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type %q, want the text format 0.0.4", ct)
	}
	return rec.Body.String()
}

// ParseText parses the Prometheus text format as Prometheus does.
func ParseText(body string) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(strings.NewReader(body))
}

// SampleValue returns the value of the sample line "series value" in
// body; it fails the test if there is none.
func SampleValue(t testing.TB, body, series string) uint64 {
	t.Helper()
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: value %q: %v", series, v, err)
			}
			return uint64(f)
		}
	}
	t.Fatalf("no sample %s", series)
	return 0
}

// CountPrefix counts the lines of body that start with prefix.
func CountPrefix(body, prefix string) int {
	n := 0
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, prefix) {
			n++
		}
	}
	return n
}

// ScrapeBody scrapes with get, checks the body (CheckExposition) and
// returns its series.
func ScrapeBody(t *testing.T, get func(*testing.T) string) Series {
	t.Helper()
	body := get(t)
	CheckExposition(t, body)
	fams, err := ParseText(body)
	if err != nil {
		t.Fatal(err)
	}
	return FamilySeries(t, fams)
}

// FamilySeries flattens parsed families into series; it fails the test on
// a type other than counter and gauge or a duplicate series.
func FamilySeries(t testing.TB, fams map[string]*dto.MetricFamily) Series {
	t.Helper()
	out := Series{}
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

// CheckExposition parses body as the Prometheus text format and fails the
// test on a parse error, a duplicate series, a family split in two, or a
// sample without its TYPE line. It returns the number of series.
func CheckExposition(t testing.TB, body string) int {
	t.Helper()
	if _, err := ParseText(body); err != nil {
		t.Fatalf("the body does not parse: %v", err)
	}
	typed := map[string]bool{}
	seen := map[string]bool{}
	done := map[string]bool{} // families whose group has ended
	cur := ""
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			typed[strings.Fields(rest)[0]] = true
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		series, _, _ := strings.Cut(line, " ")
		name, labels, _ := strings.Cut(series, "{")
		if !typed[name] {
			t.Errorf("sample without a TYPE line: %s", line)
		}
		if name != cur {
			if done[name] {
				t.Errorf("family %s split in two groups", name)
			}
			done[cur], cur = true, name
		}
		key := name + "{" + sortLabels(strings.TrimSuffix(labels, "}")) + "}"
		if seen[key] {
			t.Errorf("duplicate series %s", key)
		}
		seen[key] = true
		n++
	}
	return n
}

// sortLabels sorts a label list `a="x",b="y"` (values without commas).
func sortLabels(l string) string {
	if l == "" {
		return ""
	}
	parts := strings.Split(l, ",")
	for i := 1; i < len(parts); i++ {
		for j := i; j > 0 && parts[j] < parts[j-1]; j-- {
			parts[j], parts[j-1] = parts[j-1], parts[j]
		}
	}
	return strings.Join(parts, ",")
}
