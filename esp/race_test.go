//go:build race

package esp

// raceEnabled reports whether the race detector is on.
const raceEnabled = true
