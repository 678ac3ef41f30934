package main

import (
	"strings"
	"testing"
)

// TestEmptyStateDirRefused: without a state directory espd cannot know,
// after a restart, what a key added again has already sent, so it refuses
// to start rather than risk repeating a (key, sequence number) pair.
func TestEmptyStateDirRefused(t *testing.T) {
	for _, args := range [][]string{{"--state-dir", ""}, {"--state-dir="}} {
		// A bad --log-format, checked after the state directory, stops
		// run before it starts anything even if the check were gone.
		err := run(append(args, "--log-format", "bogus"))
		if err == nil || !strings.Contains(err.Error(), "--state-dir is empty") {
			t.Errorf("espd %q: %v, want the empty --state-dir refused", args, err)
		}
	}
}
