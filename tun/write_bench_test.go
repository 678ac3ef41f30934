package tun_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// BenchmarkWrite writes b.N 60-byte datagrams (as small as a TCP ACK), each
// of its own flow so that none coalesce, with Device.Write in batches of
// 1, 8, 32 and 128, through io_uring and with writev(2) (NoURing): ns/op
// is per packet. Forwarding is off in the namespace, so the kernel drops
// each packet after IP input, the same work on both paths.
func BenchmarkWrite(b *testing.B) {
	for _, path := range []struct {
		name    string
		noURing bool
	}{{"uring", false}, {"writev", true}} {
		b.Run(path.name, func(b *testing.B) {
			ns := testbed.NewNodeT(b, "tun")
			var dev *tun.Device
			if err := ns.Do(func() (err error) {
				dev, err = tun.Create(tun.Config{Name: "esptest11", NoURing: path.noURing})
				return err
			}); err != nil {
				b.Fatal(err)
			}
			defer dev.Close()
			if err := dev.URingErr(); !path.noURing && err != nil {
				b.Skipf("io_uring unavailable: %v", err)
			}
			src, dst := netip.MustParseAddr("198.18.117.2"), netip.MustParseAddr("198.18.118.2")
			const off = 16
			bufs := make([][]byte, 128)
			for i := range bufs {
				bufs[i] = withOffset(off, udp4(src, dst, 40000, uint16(6000+i), 17, make([]byte, 32)))
			}
			for _, batch := range []int{1, 8, 32, 128} {
				b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
					b.ReportAllocs()
					for left := b.N; left > 0; left -= batch {
						if err := dev.Write(bufs[:min(batch, left)], off); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}
