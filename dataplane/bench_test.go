package dataplane

import (
	"fmt"
	"net/netip"
	"testing"
)

// drive pushes batches of tmpl into the harness's TUN, keeping at most
// limit packets in flight, until total packets have been counted on done
// (which receives packet counts).
func drive(h *harness, tmpl [][]byte, total, limit int, done <-chan int) {
	sent, got := 0, 0
	for got < total {
		if sent < total && sent-got+len(tmpl) <= limit {
			h.tun.in <- tmpl
			sent += len(tmpl)
			continue
		}
		got += <-done
	}
}

// benchHarness is a harness that records nothing and reports counts on a
// channel: sent outer packets (outbound) or packets written back to the
// TUN (loop).
func benchHarness(tb testing.TB, loop bool, m pipelineMode) (*harness, chan int) {
	h := newHarness(tb, Config{Workers: m.workers, HandOffBelow: m.below, QueueLen: 64}, loop)
	h.tun.record, h.tx.record = false, false
	done := make(chan int, 4096)
	if loop {
		h.tun.notify = done
	} else {
		h.tx.notify = done
	}
	h.add(tunnel{reqid: 1, spi: 0x100, dst: netip.MustParsePrefix("198.19.1.0/24")})
	return h, done
}

func template(n, size int) [][]byte {
	tmpl := make([][]byte, n)
	for i := range tmpl {
		tmpl[i] = udpPacket(innerSrc4, netip.MustParseAddr("198.19.1.1"), 1000, 2000, uint64(i), size, false)
	}
	return tmpl
}

// pipelineMode is how a device runs its crypto: run to completion
// (workers 0), always on the workers, or on whichever its measured rate
// picks (below).
type pipelineMode struct{ workers, below int }

func (m pipelineMode) String() string {
	if m.below > 0 {
		return fmt.Sprintf("workers=%d,hand-off-below=%d", m.workers, m.below)
	}
	return fmt.Sprintf("workers=%d", m.workers)
}

var pipelineModes = []pipelineMode{{0, 0}, {2, 0}, {2, DefaultHandOffBelow}}

// TestNoAllocsPerPacket runs batches through the whole pipeline, out and
// back in, in each pipelineMode, and checks that the steady
// state allocates nothing.
func TestNoAllocsPerPacket(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, m := range pipelineModes {
		t.Run(m.String(), func(t *testing.T) {
			h, done := benchHarness(t, true, m)
			tmpl := template(64, 512)
			drive(h, tmpl, 64*200, 64*8, done) // warm the pools up
			allocs := testing.AllocsPerRun(200, func() { drive(h, tmpl, len(tmpl), len(tmpl), done) })
			if allocs != 0 {
				t.Errorf("%.2f allocations per batch of %d packets through the pipeline, want 0", allocs, len(tmpl))
			}
			if st, drops := h.d.Stats(), h.db.Stats().Drops; st.QueueDrops != 0 || totalDrops(drops) != 0 {
				t.Errorf("drops during the run: %+v, states' drops %v", st, drops)
			}
		})
	}
}

func benchmarkPipeline(b *testing.B, loop bool) {
	for _, m := range pipelineModes {
		b.Run(m.String(), func(b *testing.B) { benchmarkSizes(b, loop, m) })
	}
}

func benchmarkSizes(b *testing.B, loop bool, m pipelineMode) {
	for _, size := range []int{64, 512, 1400} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			h, done := benchHarness(b, loop, m)
			tmpl := template(h.tun.BatchSize(), size)
			drive(h, tmpl, len(tmpl)*16, len(tmpl)*8, done)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			drive(h, tmpl, b.N, len(tmpl)*8, done)
			b.StopTimer()
			if st := h.d.Stats(); st.QueueDrops != 0 {
				b.Errorf("%d queue drops", st.QueueDrops)
			}
		})
	}
}

// BenchmarkOutbound: TUN -> policy and state lookup -> AES-128-GCM ->
// sender, one flow, batches of 64.
func BenchmarkOutbound(b *testing.B) { benchmarkPipeline(b, false) }

// BenchmarkRoundTrip: the outbound path, then receive, replay check,
// decryption, selector check and TUN write of the same packets.
func BenchmarkRoundTrip(b *testing.B) { benchmarkPipeline(b, true) }

// BenchmarkTunnels: the round trip of BenchmarkRoundTrip, 1400-byte
// packets, through 1 tunnel and through 256, whose packets are mixed in
// every batch (batch i carries one packet of each of 64 tunnels, the next
// 64 in the next batch): the hub case, where the in-order stages of
// several shards run at once.
func BenchmarkTunnels(b *testing.B) {
	for _, m := range pipelineModes {
		for _, n := range []int{1, 256} {
			b.Run(fmt.Sprintf("%v/tunnels=%d", m, n), func(b *testing.B) { benchmarkTunnels(b, m, n) })
		}
	}
}

func benchmarkTunnels(b *testing.B, m pipelineMode, n int) {
	const size = 1400
	h := newHarness(b, Config{Workers: m.workers, HandOffBelow: m.below, QueueLen: 64}, true)
	h.tun.record, h.tx.record = false, false
	done := make(chan int, 4096)
	h.tun.notify = done
	tns, dsts := manyTunnels(n)
	for _, tn := range tns {
		h.add(tn)
	}
	bs := h.tun.BatchSize()
	tmpls := make([][][]byte, max(n/bs, 1))
	for i := range tmpls {
		tmpls[i] = make([][]byte, bs)
		for j := range tmpls[i] {
			tmpls[i][j] = udpPacket(innerSrc4, dsts[(i*bs+j)%n], 1000, 2000, uint64(j), size, false)
		}
	}
	driveAll := func(total int) {
		sent, got, i := 0, 0, 0
		for got < total {
			if sent < total && sent-got+bs <= bs*8 {
				h.tun.in <- tmpls[i%len(tmpls)]
				i++
				sent += bs
				continue
			}
			got += <-done
		}
	}
	driveAll(bs * 16)
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	driveAll(b.N)
	b.StopTimer()
	if st, drops := h.d.Stats(), h.db.Stats().Drops; st.QueueDrops != 0 || totalDrops(drops) != 0 {
		b.Errorf("drops: %+v, states' drops %v", st, drops)
	}
}
