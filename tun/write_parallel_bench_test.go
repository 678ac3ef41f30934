package tun_test

import (
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// BenchmarkWriteParallel writes batches of 32 60-byte datagrams, each of
// its own flow (none coalesce), from GOMAXPROCS goroutines at once (-cpu
// 1,2,4,8), each with its own buffers, as the shards' in-order stages
// write, through io_uring and with writev(2). ns/packet is wall time per
// packet over all goroutines. Forwarding is off: the kernel drops each
// packet after IP input.
func BenchmarkWriteParallel(b *testing.B) {
	for _, path := range []struct {
		name    string
		noURing bool
	}{{"uring", false}, {"writev", true}} {
		b.Run(path.name, func(b *testing.B) {
			ns := testbed.NewNodeT(b, "tun")
			var dev *tun.Device
			if err := ns.Do(func() (err error) {
				dev, err = tun.Create(tun.Config{Name: "esptest13", NoURing: path.noURing})
				return err
			}); err != nil {
				b.Fatal(err)
			}
			defer dev.Close()
			if err := dev.URingErr(); !path.noURing && err != nil {
				b.Skipf("io_uring unavailable: %v", err)
			}
			const batch, off = 32, 16
			var next atomic.Uint32
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				g := next.Add(1)
				src := netip.AddrFrom4([4]byte{198, 18, 121, byte(g)})
				dst := netip.MustParseAddr("198.18.122.2")
				bufs := make([][]byte, batch)
				for i := range bufs {
					bufs[i] = withOffset(off, udp4(src, dst, 40000, uint16(6000+i), 17, make([]byte, 32)))
				}
				for pb.Next() {
					if err := dev.Write(bufs, off); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/packet")
		})
	}
}
