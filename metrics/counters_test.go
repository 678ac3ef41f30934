package metrics

import (
	"reflect"
	"strings"
	"testing"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/dataplane"
)

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

	var st conn.IKEStats
	v := reflect.ValueOf(&st).Elem()
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
	want["espd_ike_undelivered_total{}"] = 1_999_999
	m := New(Sources{DB: db, Dataplane: noDP, IKE: func() IKE { return IKE{Relay: st, Undelivered: 1_999_999} }})
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
	for name, fam := range fams {
		if h := fam.GetHelp(); strings.HasPrefix(name, "espd_ike_") && (h == "" || !strings.HasSuffix(h, ".")) {
			t.Errorf("%s: help %q is not a sentence", name, h)
		}
	}
}
