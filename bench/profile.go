package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/espd/espd/bench/system"
)

// startProfile starts recording CPU profiles of s's gateway processes
// over the measured window (-profile DIR; systems that implement
// system.Profiler: espd's), named after the run, and returns a function
// that waits for them and reports the outcome; without -profile, or for
// another system, it records nothing and the function returns nil.
func (h *harness) startProfile(ctx context.Context, s system.System, run string) (wait func() error) {
	p, ok := s.(system.Profiler)
	if h.o.profile == "" || !ok {
		return func() error { return nil }
	}
	if err := os.MkdirAll(h.o.profile, 0o755); err != nil {
		return func() error { return err }
	}
	base := filepath.Join(h.o.profile, profileName(run))
	errc := make(chan error, 1)
	go func() { errc <- p.ProfileCPU(ctx, h.o.duration, base+"-gwA.pprof", base+"-gwB.pprof") }()
	return func() error { return <-errc }
}

// profileName turns a run's description into a file name.
func profileName(run string) string {
	return strings.Trim(strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_':
			return r
		}
		return '-'
	}, run), "-")
}

// runName names a run for its profile files: its sequence number, system,
// suite and point.
func runName(seq int, system, suite, point string) string {
	return fmt.Sprintf("%03d %s %s %s", seq, system, suite, point)
}
