package dataplane

import (
	"net/netip"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestSendFailuresLogLimited: a burst of packets whose sends all fail logs
// "outer send failed" at most once a second, each line saying how many
// were held back since the previous one (conn.LogLimit).
func TestSendFailuresLogLimited(t *testing.T) {
	logs := &testbed.Logs{}
	h := newHarnessLog(t, Config{Workers: 2}, false, nil, logs.Logger())
	h.add(tunnel{reqid: 9, spi: 0x900, dst: netip.MustParsePrefix("198.19.9.0/24")})
	h.tx.failAll.Store(true)
	dst := netip.MustParseAddr("198.19.9.9")
	const burst = 200
	start := time.Now()
	for i := range burst {
		h.tun.in <- [][]byte{udpPacket(innerSrc4, dst, 1, 2, uint64(i), 200, false)}
	}
	waitFor(t, "the failed sends", func() bool { return h.d.Stats().SendErrors == burst })
	lines := logs.Records("outer send failed")
	if max := 1 + int(time.Since(start)/time.Second); len(lines) < 1 || len(lines) > max {
		t.Fatalf("%d failed sends logged %d lines, want 1 to %d", burst, len(lines), max)
	}
	for _, r := range lines {
		if _, ok := testbed.Attr(r, "suppressed"); !ok {
			t.Fatalf("line %q has no suppressed count", r.Message)
		}
	}

	// A second later the next failure logs again, with the count of the
	// lines held back.
	last := lines[len(lines)-1].Time
	waitFor(t, "a second after the last line", func() bool { return time.Since(last) > time.Second })
	h.tun.in <- [][]byte{udpPacket(innerSrc4, dst, 1, 2, burst, 200, false)}
	waitFor(t, "another line", func() bool { return len(logs.Records("outer send failed")) > len(lines) })
	var held uint64
	for _, r := range logs.Records("outer send failed") {
		v, _ := testbed.Attr(r, "suppressed")
		held += v.Uint64()
	}
	if total := held + uint64(len(logs.Records("outer send failed"))); held == 0 || total > burst+1 {
		t.Errorf("lines report %d held back, %d in all, for %d failing batches", held, total, burst+1)
	}
}
