package main

import "github.com/espd/espd/bench/report"

// point is one measurement configuration of a system: TCP at an MSS, the
// UDP packet rate, or ping.
type point struct {
	kind string
	mss  int
}

// step is one run of the schedule.
type step struct {
	block int // suite block
	pt    point
	rep   int // 0-based
	sys   int // index into the systems
}

// points lists the measurements of each suite block.
func points(o *options) []point {
	var ps []point
	for _, m := range o.mss {
		ps = append(ps, point{report.KindTCP, m})
	}
	if o.udp {
		ps = append(ps, point{report.KindUDP, 0})
	}
	if o.ping {
		ps = append(ps, point{report.KindPing, 0})
	}
	return ps
}

// independentBlock is the suite block in which a system that does not
// depend on the suite makes its run rep of each point: the runs are
// spread evenly over the blocks, so that they are interleaved with the
// per-suite systems across the whole run rather than bunched at its start.
func independentBlock(rep, reps, blocks int) int {
	return rep * blocks / reps
}

// makePlan returns the schedule: suite block by suite block (so that each
// per-suite system is keyed once per suite), point by point, repetition by
// repetition, every system in turn, the order rotated by one system each
// repetition so that no system always runs first after a change.
func makePlan(blocks int, pts []point, reps int, perSuite []bool) []step {
	var steps []step
	n := len(perSuite)
	for b := range blocks {
		for _, p := range pts {
			for r := range reps {
				for k := range n {
					i := (k + r) % n
					if perSuite[i] || independentBlock(r, reps, blocks) == b {
						steps = append(steps, step{block: b, pt: p, rep: r, sys: i})
					}
				}
			}
		}
	}
	return steps
}
