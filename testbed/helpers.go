package testbed

import (
	"fmt"
	"strings"
	"time"
)

// Tail returns the last n lines of s (a log), after a line saying how many
// came before them if any did.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines before)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// CountLines returns how many lines of s (a log) contain every one of subs.
func CountLines(s string, subs ...string) int {
	n := 0
	for line := range strings.SplitSeq(s, "\n") {
		ok := true
		for _, sub := range subs {
			if !strings.Contains(line, sub) {
				ok = false
				break
			}
		}
		if ok {
			n++
		}
	}
	return n
}

// Poll calls cond every interval until it returns true or timeout has
// passed, and reports whether it returned true. cond runs at least once.
func Poll(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}
