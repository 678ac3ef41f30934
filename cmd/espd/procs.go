package main

import (
	"os"
	"runtime"

	"github.com/espd/espd/dataplane"
)

// setProcs sets GOMAXPROCS to n if n > 0; else, unless the GOMAXPROCS
// environment variable decides, to half the CPUs (at least one) while the
// readers run their batches to completion, and to all of them while a
// direction hands batches off (dp.OnHandOff). It returns the value in
// effect. Why: docs/dataplane.md, "Handing off by crypto rate".
func setProcs(n int, dp *dataplane.Config) int {
	all := runtime.GOMAXPROCS(0)
	half := max(1, all/2)
	switch {
	case n > 0:
		runtime.GOMAXPROCS(n)
	case os.Getenv("GOMAXPROCS") != "":
	case dp.Workers == 0:
		runtime.GOMAXPROCS(half)
	case dp.HandOffBelow > 0 && half < all:
		runtime.GOMAXPROCS(half)
		dp.OnHandOff = func(handOff bool) {
			if handOff {
				runtime.GOMAXPROCS(all)
			} else {
				runtime.GOMAXPROCS(half)
			}
		}
	}
	return runtime.GOMAXPROCS(0)
}
