package main

import (
	"runtime"
	"testing"

	"github.com/espd/espd/dataplane"
)

// TestSetProcs checks the GOMAXPROCS rules: --procs wins; --workers 0 runs
// on half the CPUs; workers with --hand-off-below start on half and go to
// all of them while a direction hands off; workers without it use all.
func TestSetProcs(t *testing.T) {
	all := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(all)
	t.Setenv("GOMAXPROCS", "")
	half := max(1, all/2)

	if got := setProcs(1, &dataplane.Config{Workers: 4}); got != 1 {
		t.Errorf("--procs 1: GOMAXPROCS %d", got)
	}
	runtime.GOMAXPROCS(all)
	if got := setProcs(0, &dataplane.Config{}); got != half {
		t.Errorf("--workers 0: GOMAXPROCS %d, want %d", got, half)
	}
	runtime.GOMAXPROCS(all)
	cfg := &dataplane.Config{Workers: all, HandOffBelow: dataplane.DefaultHandOffBelow}
	got := setProcs(0, cfg)
	if all == 1 {
		if got != 1 || cfg.OnHandOff != nil {
			t.Fatalf("one CPU: GOMAXPROCS %d, OnHandOff set %v", got, cfg.OnHandOff != nil)
		}
		return
	}
	if got != half || cfg.OnHandOff == nil {
		t.Fatalf("workers with --hand-off-below: GOMAXPROCS %d (want %d), OnHandOff set %v", got, half, cfg.OnHandOff != nil)
	}
	cfg.OnHandOff(true)
	if got := runtime.GOMAXPROCS(0); got != all {
		t.Errorf("handing off: GOMAXPROCS %d, want %d", got, all)
	}
	cfg.OnHandOff(false)
	if got := runtime.GOMAXPROCS(0); got != half {
		t.Errorf("back to run to completion: GOMAXPROCS %d, want %d", got, half)
	}
	runtime.GOMAXPROCS(all)
	if got := setProcs(0, &dataplane.Config{Workers: all}); got != all {
		t.Errorf("workers, --hand-off-below 0: GOMAXPROCS %d, want %d", got, all)
	}
	t.Setenv("GOMAXPROCS", "1")
	runtime.GOMAXPROCS(all)
	if got := setProcs(0, &dataplane.Config{}); got != all {
		t.Errorf("GOMAXPROCS set in the environment: changed to %d", got)
	}
}
