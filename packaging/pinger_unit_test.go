package packaging

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPingerMissed feeds pinger.update a ping -D -O log (replies, a late
// reply, a duplicate, requests never answered) and checks what
// pinger.missed counts in windows around the losses.
func TestPingerMissed(t *testing.T) {
	base := time.Unix(1796658860, 0)
	var log strings.Builder
	line := func(seq int, reply bool) {
		at := base.Add(time.Duration(seq) * 50 * time.Millisecond)
		if reply {
			fmt.Fprintf(&log, "[%d.%06d] 64 bytes from 198.18.2.2: icmp_seq=%d ttl=62 time=1.00 ms\n", at.Unix(), at.Nanosecond()/1000, seq)
		} else {
			fmt.Fprintf(&log, "[%d.%06d] no answer yet for icmp_seq=%d\n", at.Unix(), at.Nanosecond()/1000, seq)
		}
	}
	for seq := 1; seq <= 100; seq++ {
		switch seq {
		case 20: // lost
			line(seq, false)
		case 40, 41, 42: // three in a row lost
			line(seq, false)
		case 60: // late: answered after the next request went out
			line(seq, false)
		case 61:
			line(seq, true)
			line(60, true)
			line(61, true) // a duplicate
		default:
			line(seq, true)
		}
	}
	p := &pinger{name: "test", runs: 1, log: filepath.Join(t.TempDir(), "ping.log")}
	if err := os.WriteFile(p.log, []byte(log.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// Request n was sent at base + n*50 ms - 1 ms (its reply's time less
	// its round trip): a window from seq a to seq b holds a..b.
	sent := func(n int) time.Time { return base.Add(time.Duration(n)*50*time.Millisecond - time.Millisecond) }
	for _, c := range []struct {
		from, to       int
		missed, answrd int
		ok             bool
	}{
		{10, 30, 1, 20, true},  // seq 20 lost
		{20, 30, 1, 10, true},  // the window starts on the loss
		{21, 30, 1, 10, true},  // after it: counted from the last answer before the window
		{22, 30, 0, 9, true},   // one answer after it
		{35, 45, 3, 8, true},   // three in a row
		{55, 65, 0, 11, true},  // late and duplicate replies count once
		{1, 100, 0, 96, false}, // nothing answered before seq 1 or after 100
	} {
		missed, answered, ok := p.missed(sent(c.from), sent(c.to))
		if missed != c.missed || answered != c.answrd || ok != c.ok {
			t.Errorf("missed(seq %d, seq %d) = %d, %d, %v; want %d, %d, %v", c.from, c.to, missed, answered, ok, c.missed, c.answrd, c.ok)
		}
	}
}
