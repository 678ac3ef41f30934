package main

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestMakePlan(t *testing.T) {
	pts := []point{{"tcp", 0}, {"tcp", 200}, {"udp", 0}}
	perSuite := []bool{false, true, true, false} // routing, espd, libipsec, wireguard-go
	const blocks, reps = 6, 3
	steps := makePlan(blocks, pts, reps, perSuite)
	count := map[string]int{}
	blocksOf := map[int][]int{}
	for _, s := range steps {
		count[fmt.Sprint(s.sys, s.pt, s.block)]++
		if !perSuite[s.sys] && s.pt == pts[0] {
			blocksOf[s.sys] = append(blocksOf[s.sys], s.block)
		}
	}
	for sys, ps := range perSuite {
		for b := range blocks {
			for _, p := range pts {
				n := count[fmt.Sprint(sys, p, b)]
				if ps && n != reps {
					t.Errorf("per-suite system %d: %d runs of %v in block %d, want %d", sys, n, p, b, reps)
				}
			}
		}
	}
	// Systems with their own cipher make reps runs per point, spread
	// over the blocks.
	for _, sys := range []int{0, 3} {
		if got := blocksOf[sys]; !slices.Equal(got, []int{0, 2, 4}) {
			t.Errorf("system %d runs in blocks %v, want [0 2 4]", sys, got)
		}
	}
	if want := blocks*len(pts)*reps*2 + len(pts)*reps*2; len(steps) != want {
		t.Errorf("%d steps, want %d", len(steps), want)
	}
	// Interleaved: within a point of a block, the systems alternate, and
	// the first system rotates with the repetition.
	var firsts []int
	for i, s := range steps {
		if s.block == 1 && s.pt == pts[1] && (i == 0 || steps[i-1].rep != s.rep || steps[i-1].pt != s.pt) {
			firsts = append(firsts, s.sys)
		}
	}
	if !slices.Equal(firsts, []int{1, 1, 2}) {
		t.Errorf("first system of each repetition in block 1: %v", firsts)
	}
	// One block: all runs there.
	for _, s := range makePlan(1, pts, reps, perSuite) {
		if s.block != 0 {
			t.Fatalf("step in block %d of 1", s.block)
		}
	}
}

func TestOptions(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseOptions([]string{"-quick"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.systems, []string{"routing", "espd"}) || len(o.suites) != 1 || o.suites[0].String() != "aes128gcm16" ||
		!slices.Equal(o.mss, []int{0}) || o.duration != 2*time.Second || o.reps != 1 || o.udp || o.ping {
		t.Errorf("-quick: %+v", o)
	}
	o, err = parseOptions([]string{"-quick", "-reps", "2", "-mss", "max,500", "-systems", "all"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o.reps != 2 || !slices.Equal(o.mss, []int{0, 500}) || len(o.systems) != len(systemNames()) {
		t.Errorf("-quick with explicit flags: reps %d mss %v systems %v", o.reps, o.mss, o.systems)
	}
	o, err = parseOptions([]string{"-systems", "wireguard-go,espd", "-noaesni", "-6"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"espd", "espd-noaesni", "wireguard-go", "wireguard-go-noaesni"}; !slices.Equal(o.systems, want) {
		t.Errorf("-noaesni systems %v, want %v", o.systems, want)
	}
	if len(o.suites) != 6 || !slices.Equal(o.mss, []int{0, 1000, 500, 200}) || o.reps != 3 || o.family != 6 {
		t.Errorf("defaults: %+v", o)
	}
	for _, bad := range [][]string{
		{"-systems", "ipsec-tools"}, {"-suites", "3des-sha1"}, {"-mss", "20"}, {"-mss", "big"},
		{"-reps", "0"}, {"-tool", "netperf"}, {"-duration", "1ms"}, {"extra"},
	} {
		if _, err := parseOptions(bad, &stderr); err == nil {
			t.Errorf("parseOptions(%q) accepted", bad)
		}
	}
}
