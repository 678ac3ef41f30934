package main

import (
	"os"
	"runtime"

	"github.com/espd/espd/dataplane"
)

// setProcs sets GOMAXPROCS: n if n > 0; otherwise, unless the GOMAXPROCS
// environment variable decides, half the CPUs (at least one) whenever the
// readers run their batches to completion: with --workers 0 always, and
// with workers and --hand-off-below while no direction hands batches off
// to the workers (dp.OnHandOff switches to all the CPUs while one does, as
// the workers then need them; the data plane calls it from a goroutine of
// its own, at most every 500 ms, never from the per-batch path, since a
// GOMAXPROCS change stops the world). A reader running to completion is about one
// busy goroutine per direction, and the kernel's side of the traffic (TUN
// and socket copies, softirqs) needs the other CPUs; with more Ps than busy
// goroutines the runtime keeps waking spare threads that find nothing to
// do: on 2 CPUs GOMAXPROCS 1 carried 10-15% more ESP-in-UDP throughput at
// 10% less CPU per GB (docs/benchmarks-history.md, "Workers or run to
// completion"). It returns the value in effect.
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
