package main

import (
	"os"
	"runtime"
)

// setProcs sets GOMAXPROCS: n if n > 0; otherwise, unless the GOMAXPROCS
// environment variable decides, half the CPUs (at least one) when the data
// plane runs without workers, as each reader then runs its batches to
// completion: about one busy goroutine per direction, and the kernel's
// side of the traffic (TUN and socket copies, softirqs) needs the other
// CPUs. With more Ps than busy goroutines the runtime keeps waking spare
// threads that find nothing to do: on 2 CPUs GOMAXPROCS 1 carried 10-15%
// more ESP-in-UDP throughput at 10% less CPU per GB (BENCHMARKS.md).
// It returns the value in effect.
func setProcs(n, workers int) int {
	switch {
	case n > 0:
		runtime.GOMAXPROCS(n)
	case os.Getenv("GOMAXPROCS") == "" && workers == 0:
		runtime.GOMAXPROCS(max(1, runtime.GOMAXPROCS(0)/2))
	}
	return runtime.GOMAXPROCS(0)
}
