package procstat

import (
	"os"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// A command name with a space and a parenthesis, as prctl allows.
	line := []byte("4242 (we ird) name) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 9 0 100 0 0\n")
	got, err := parseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3250 * time.Millisecond; got != want {
		t.Errorf("parseStat = %v, want %v", got, want)
	}
	for _, bad := range []string{"4242 no name 1 2 3", "1 (x) S 1 2 3", "1 (x) S 1 2 3 4 5 6 7 8 9 10 u s"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) accepted", bad)
		}
	}
}

func TestParseHost(t *testing.T) {
	h, err := parseHost([]byte("cpu  100 2 30 400 5 6 7 8 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if h.User != time.Second || h.Softirq != 70*time.Millisecond || h.Steal != 80*time.Millisecond {
		t.Errorf("parseHost = %+v", h)
	}
	if got, want := h.Busy(), (100+2+30+6+7)*10*time.Millisecond; got != want {
		t.Errorf("Busy = %v, want %v", got, want)
	}
	if d := h.Sub(h); d != (Host{}) {
		t.Errorf("h - h = %+v", d)
	}
	if _, err := parseHost([]byte("intr 1 2 3\n")); err == nil {
		t.Error("parseHost accepted a line that is not cpu")
	}
}

// TestSelf reads this process's own CPU time and the machine's, which must
// both be readable and grow with work.
func TestSelf(t *testing.T) {
	before, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	h0, err := ReadHost()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	after, _ := ProcessCPU(os.Getpid())
	h1, _ := ReadHost()
	if after <= before {
		t.Errorf("process CPU did not grow over 300 ms of work: %v -> %v (%d)", before, after, x)
	}
	if h1.Busy() <= h0.Busy() {
		t.Errorf("machine busy time did not grow: %v -> %v", h0.Busy(), h1.Busy())
	}
	if _, err := ProcessCPU(-1); err == nil {
		t.Error("ProcessCPU(-1) succeeded")
	}
}
