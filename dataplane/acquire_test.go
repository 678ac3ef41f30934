package dataplane

import (
	"net/netip"
	"testing"
	"time"

	"github.com/espd/espd/sa"
)

// TestAcquireFlood: packets to many destinations of a protect policy
// without a state raise at most the global acquire budget
// (sa.DefaultAcquireRate a second, in bursts of as many), not one acquire
// per destination; each packet counts in NoSA, and NoSA minus the
// acquires is what the limits held back (espd_dataplane_no_sa_total
// minus espd_acquires_total).
func TestAcquireFlood(t *testing.T) {
	h := newHarness(t, Config{Workers: 2}, false)
	h.add(tunnel{reqid: 9, spi: 0x900, dst: netip.MustParsePrefix("198.19.0.0/16"), skipOut: true, skipIn: true})
	const dsts, packets = 5000, 10000
	start := time.Now()
	for i := 0; i < packets; i += 50 {
		batch := make([][]byte, 50)
		for j := range batch {
			k := (i + j) % dsts
			batch[j] = udpPacket(innerSrc4, netip.AddrFrom4([4]byte{198, 19, byte(k >> 8), byte(k)}), 1, 2, 0, 100, false)
		}
		h.tun.in <- batch
	}
	waitFor(t, "the no-SA drops", func() bool { return h.d.Stats().NoSA == packets })
	elapsed := time.Since(start)
	g := h.db.Stats()
	if max := uint64(sa.DefaultAcquireRate) * uint64(1+elapsed/time.Second+1); g.Acquires == 0 || g.Acquires > max {
		t.Errorf("%d packets to %d destinations in %v raised %d acquires, want 1 to %d", packets, dsts, elapsed, g.Acquires, max)
	}
	if g.Acquires+g.AcquiresSuppressed != packets {
		t.Errorf("acquires %d + suppressed %d != %d packets without a state", g.Acquires, g.AcquiresSuppressed, packets)
	}
}
