package main

import (
	"maps"
	"testing"
)

func TestDropsDelta(t *testing.T) {
	before := map[string]uint64{"esp0": 10, "veth-a": 3, "lo": 0}
	after := map[string]uint64{"esp0": 1244, "veth-a": 3, "lo": 0, "wg7": 5}
	got := dropsDelta(before, after)
	want := map[string]uint64{"esp0": 1234, "wg7": 5}
	if !maps.Equal(got, want) {
		t.Errorf("dropsDelta = %v, want %v", got, want)
	}
	if d := dropsDelta(after, after); d != nil {
		t.Errorf("nothing moved: %v, want nil", d)
	}
	if s := dropsSummary(got, map[string]uint64{"esp0": 2}); s != "gwA esp0 1234 wg7 5, gwB esp0 2" {
		t.Errorf("dropsSummary = %q", s)
	}
	if s := dropsSummary(nil, nil); s != "" {
		t.Errorf("dropsSummary of nothing = %q", s)
	}
}
