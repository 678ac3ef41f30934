package testbed

import (
	"testing"
	"time"
)

func TestTail(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\n", 3, "a\nb"},
		{"a\nb", 2, "a\nb"},
		{"a\nb\nc\nd\n", 2, "... (2 lines before)\nc\nd"},
	} {
		if got := Tail(c.in, c.n); got != c.want {
			t.Errorf("Tail(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

func TestCountLines(t *testing.T) {
	log := "x rekey net{1} established\nrekey job\nnet{2} established\n"
	for _, c := range []struct {
		subs []string
		want int
	}{
		{[]string{"established"}, 2},
		{[]string{"net{", "established"}, 2},
		{[]string{"rekey", "established"}, 1},
		{[]string{"panic"}, 0},
	} {
		if got := CountLines(log, c.subs...); got != c.want {
			t.Errorf("CountLines(%q) = %d, want %d", c.subs, got, c.want)
		}
	}
}

func TestPoll(t *testing.T) {
	n := 0
	if !Poll(5*time.Second, time.Millisecond, func() bool { n++; return n == 3 }) || n != 3 {
		t.Errorf("Poll: %d calls", n)
	}
	start := time.Now()
	n = 0
	if Poll(50*time.Millisecond, 10*time.Millisecond, func() bool { n++; return false }) {
		t.Error("Poll of a false condition reported true")
	}
	if d := time.Since(start); d < 50*time.Millisecond || n < 2 {
		t.Errorf("Poll gave up after %v and %d calls", d, n)
	}
}
