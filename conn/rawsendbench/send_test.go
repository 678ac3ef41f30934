package rawsendbench

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// paths are the ways of sending measured, by name.
var paths = []struct {
	name string
	open func(testing.TB, *bed) sender
}{
	{"ipproto-raw-sendmmsg", rawIPSender},
	{"af-packet-sendmmsg", func(tb testing.TB, bd *bed) sender { return packetSender(tb, bd, false) }},
	{"af-packet-sendmmsg-qdisc-bypass", func(tb testing.TB, bd *bed) sender { return packetSender(tb, bd, true) }},
	{"af-packet-tx-ring", newRingSender},
}

// TestEveryPathDelivers sends a batch through each path and reads every
// packet back, intact and in order, from b's raw ESP socket.
func TestEveryPathDelivers(t *testing.T) {
	if err := bedAvailable(); err != nil {
		t.Skip(err)
	}
	bd := newBed(t)
	for k, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			s := p.open(t, bd)
			spi := uint32(0x1000 + k)
			pkts := make([][]byte, batch)
			for i := range pkts {
				pkts[i] = espPacket(spi, uint32(i+1))
			}
			if err := s.send(pkts); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 2048)
			got := 0
			deadline := time.Now().Add(5 * time.Second)
			for got < batch && time.Now().Before(deadline) {
				n, _, err := unix.Recvfrom(bd.rx, buf, 0)
				if err == unix.EAGAIN {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if n < 28 || binary.BigEndian.Uint32(buf[20:]) != spi {
					continue // another path's
				}
				want := pkts[got]
				// The kernel may rewrite the IPv4 ID and checksum.
				if n != len(want) || !bytes.Equal(buf[20:n], want[20:]) || !bytes.Equal(buf[12:20], want[12:20]) {
					t.Fatalf("packet %d: %d bytes, not what was sent", got, n)
				}
				got++
			}
			if got != batch {
				t.Fatalf("%d of %d packets arrived", got, batch)
			}
		})
	}
}

// BenchmarkSend sends batches of 64 packets through each path; ns/op is
// per packet.
func BenchmarkSend(b *testing.B) {
	if err := bedAvailable(); err != nil {
		b.Skip(err)
	}
	bd := newBed(b)
	pkts := make([][]byte, batch)
	for i := range pkts {
		pkts[i] = espPacket(0x2000, uint32(i+1))
	}
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) {
			s := p.open(b, bd)
			b.SetBytes(pktLen)
			b.ResetTimer()
			for left := b.N; left > 0; left -= batch {
				if err := s.send(pkts[:min(left, batch)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
