package uringbench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/espd/espd/packet"
	"golang.org/x/sys/unix"
)

// batchSizes are the io_uring batches measured: submissions per
// io_uring_enter.
var batchSizes = []int{8, 32, 128}

// packetSizes are a TCP ACK's size (60 bytes, as the return ACKs of a
// tunnelled TCP stream) and a full-sized tunnelled packet.
var packetSizes = []int{60, 1400}

// writeRing writes pkts in batches of batch submissions, one
// io_uring_enter each.
func writeRing(r *ring, fd int, pkts [][]byte, batch int) error {
	for len(pkts) > 0 {
		k := min(batch, len(pkts))
		if err := r.writeBatch(fd, pkts[:k]); err != nil {
			return err
		}
		pkts = pkts[k:]
	}
	return nil
}

// receiveAll reads the sink until it has n datagrams or nothing more
// arrives within idle, and checks that each is the payload of packet i of
// size bytes, each index once.
func (b *bed) receiveAll(t *testing.T, n, size int, idle time.Duration) {
	t.Helper()
	hdr := packet.IPv4HeaderLen + packet.UDPHeaderLen
	seen := make([]bool, n)
	buf := make([]byte, 2048)
	got := 0
	for got < n {
		fds := []unix.PollFd{{Fd: int32(b.sink), Events: unix.POLLIN}}
		ready, err := unix.Poll(fds, int(idle/time.Millisecond))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		if ready == 0 {
			break
		}
		m, _, err := unix.Recvfrom(b.sink, buf, unix.MSG_DONTWAIT)
		if err != nil {
			t.Fatalf("recvfrom: %v", err)
		}
		if m != size-hdr {
			t.Fatalf("datagram of %d bytes, want %d", m, size-hdr)
		}
		i := binary.BigEndian.Uint64(buf)
		if i >= uint64(n) || seen[i] {
			t.Fatalf("datagram with index %d: out of range or seen twice", i)
		}
		for j := 8; j < m; j++ {
			if buf[j] != byte(hdr+j) {
				t.Fatalf("datagram %d: byte %d is %#x, want %#x", i, j, buf[j], byte(hdr+j))
			}
		}
		seen[i] = true
		got++
	}
	if got != n {
		t.Errorf("the sink received %d of %d datagrams", got, n)
	}
}

// TestURingWritesEveryPacket writes packets to the TUN through the ring
// (and, as the reference, with write(2)) and checks that the TUN counted
// each as received and that the UDP socket they are addressed to received
// each once, intact: the benchmark's io_uring path does the same work as
// write(2), not a no-op.
func TestURingWritesEveryPacket(t *testing.T) {
	const n = 1000 // not a multiple of any batch: the last batch is partial
	for _, size := range packetSizes {
		for _, mode := range append([]int{0}, batchSizes...) {
			name := "write"
			if mode > 0 {
				name = fmt.Sprintf("uring-%d", mode)
			}
			t.Run(fmt.Sprintf("size=%d/%s", size, name), func(t *testing.T) {
				b := newBed(t, 16<<20)
				pkts := packets(t, n, size)
				before := b.counters(t)
				var err error
				if mode == 0 {
					err = writeOne(b.tun, pkts)
				} else {
					err = writeRing(requireRing(t, 128), b.tun, pkts, mode)
				}
				if err != nil {
					t.Fatal(err)
				}
				b.receiveAll(t, n, size, 5*time.Second)
				after := b.counters(t)
				if d := after.tunRx - before.tunRx; d != n {
					t.Errorf("%s counted %d received packets, want %d", tunName, d, n)
				}
				if d := after.udpIn - before.udpIn; d != n {
					t.Errorf("UDP InDatagrams grew by %d, want %d", d, n)
				}
				if d := after.udpRcvbufErr - before.udpRcvbufErr; d != 0 {
					t.Errorf("UDP RcvbufErrors grew by %d, want 0", d)
				}
			})
		}
	}
}

// cpuNanos returns the process's user and system CPU time in ns
// (getrusage(RUSAGE_SELF): every thread, io_uring's workers included).
func cpuNanos(b *testing.B) (user, sys int64) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano(), ru.Stime.Nano()
}

// BenchmarkTUNWrite writes b.N packets to a TUN, so ns/op is ns per
// packet, by write(2) per packet (write) and by io_uring batches of 8, 32
// and 128 (uring-N). The packets reach a bound UDP socket that nobody
// reads: once its buffer is full the kernel drops them at the socket,
// after the same IP and UDP input work for either way of writing. It
// reports CPU time per packet (cpu-ns/pkt = user-ns/pkt + sys-ns/pkt),
// and for io_uring the number of iou-wrk threads afterwards (0 means the
// kernel completed every write inline, in io_uring_enter).
func BenchmarkTUNWrite(b *testing.B) {
	for _, size := range packetSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			bd := newBed(b, 1<<20)
			// One buffer per batch slot, as a batch of distinct packets.
			pkts := packets(b, batchSizes[len(batchSizes)-1], size)
			var r *ring
			for _, mode := range append([]int{0}, batchSizes...) {
				name := "write"
				if mode > 0 {
					name = fmt.Sprintf("uring-%d", mode)
					if r == nil {
						r = requireRing(b, uint32(batchSizes[len(batchSizes)-1]))
					}
				}
				b.Run(name, func(b *testing.B) {
					batch := max(mode, 1)
					u0, s0 := cpuNanos(b)
					b.ResetTimer()
					for left := b.N; left > 0; {
						k := min(batch, left, len(pkts))
						var err error
						if mode == 0 {
							err = writeOne(bd.tun, pkts[:k])
						} else {
							err = r.writeBatch(bd.tun, pkts[:k])
						}
						if err != nil {
							b.Fatal(err)
						}
						left -= k
					}
					b.StopTimer()
					u1, s1 := cpuNanos(b)
					b.ReportMetric(float64(u1-u0)/float64(b.N), "user-ns/pkt")
					b.ReportMetric(float64(s1-s0)/float64(b.N), "sys-ns/pkt")
					b.ReportMetric(float64(u1-u0+s1-s0)/float64(b.N), "cpu-ns/pkt")
					if mode > 0 {
						b.ReportMetric(float64(ioWorkers(b)), "iou-wrk")
					}
				})
			}
		})
	}
}

// BenchmarkNullSyscall is the floor under BenchmarkTUNWrite/write: one
// system call that does nothing (getppid, through unix.RawSyscall as
// espd's TUN writes), so the cost of entering and leaving the kernel on
// this machine can be told apart from the TUN's and the stack's work.
func BenchmarkNullSyscall(b *testing.B) {
	u0, s0 := cpuNanos(b)
	for b.Loop() {
		unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0)
	}
	u1, s1 := cpuNanos(b)
	b.ReportMetric(float64(u1-u0+s1-s0)/float64(b.N), "cpu-ns/op")
}
