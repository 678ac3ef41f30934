package conn

import (
	"net/netip"
	"testing"

	"github.com/espd/espd/testbed"
)

// BenchmarkSendParallel sends batches of 64 ESP packets of 1,400 bytes
// from a to b (whose sockets do not read: the kernel drops them there),
// raw ESP and ESP-in-UDP (UDP_SEGMENT), from GOMAXPROCS goroutines at once
// (-cpu 1,2,4,8), each with its own packets, as the shards' in-order
// stages send. ns/packet is wall time per packet over all goroutines.
func BenchmarkSendParallel(b *testing.B) {
	na, nb := testbed.NewNodeT(b, "dpa"), testbed.NewNodeT(b, "dpb")
	testbed.VethT(b, na, "va", nb, "vb")
	na.MustIP(b, "addr", "add", "198.18.1.1/24", "dev", "va")
	nb.MustIP(b, "addr", "add", "198.18.1.2/24", "dev", "vb")
	open := func(ns *testbed.Node) *Sockets {
		var s *Sockets
		if err := ns.Do(func() (err error) {
			s, err = OpenSockets(SocketConfig{Mark: testMark, EncapPort: 4507, NoIPv6: true})
			return err
		}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}
	sa := open(na)
	open(nb)
	src, dst := netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.1.2")
	for _, path := range []struct {
		name string
		port uint16
	}{{"raw", 0}, {"udp", 4507}} {
		b.Run(path.name, func(b *testing.B) {
			const batch = 64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				pkts := make([]Packet, batch)
				for i := range pkts {
					pl := make([]byte, 1400)
					pl[3], pl[7] = 1, byte(i)
					pkts[i] = outPkt(src, dst, path.port, path.port, 0, pl)
				}
				for pb.Next() {
					if n, err := sa.Send(pkts); n != batch || err != nil {
						b.Errorf("Send: %d, %v", n, err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/packet")
		})
	}
}
