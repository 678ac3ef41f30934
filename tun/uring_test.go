package tun_test

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// forEachPath runs f on both of Write's paths: through io_uring (noURing
// false) and with writev(2) only, as where the kernel refuses io_uring
// (Config.NoURing).
func forEachPath(t *testing.T, f func(t *testing.T, noURing bool)) {
	t.Run("uring", func(t *testing.T) { f(t, false) })
	t.Run("writev", func(t *testing.T) { f(t, true) })
}

// createPath creates the device as createIn does, with io_uring on or
// off. With it on, where the kernel refuses io_uring (no io_uring, a
// seccomp filter, kernel.io_uring_disabled) the test is skipped, or fails
// under CI=true.
func createPath(t *testing.T, ns *testbed.Node, cfg tun.Config, noURing bool) *tun.Device {
	t.Helper()
	cfg.NoURing = noURing
	dev := createIn(t, ns, cfg)
	checkPath(t, dev, noURing)
	return dev
}

// checkPath checks that dev writes as asked: io_uring off with noURing,
// else on (or the test is skipped, failed under CI=true).
func checkPath(t *testing.T, dev *tun.Device, noURing bool) {
	t.Helper()
	err := dev.URingErr()
	switch {
	case noURing && !errors.Is(err, tun.ErrURingOff):
		t.Fatalf("NoURing: URingErr %v, want ErrURingOff", err)
	case !noURing && err != nil && os.Getenv("CI") == "true":
		t.Fatalf("io_uring unavailable: %v", err)
	case !noURing && err != nil:
		t.Skipf("io_uring unavailable: %v", err)
	}
}

// checkEnters checks the io_uring_enter calls between two Stats: want on
// the io_uring path, none on writev's.
func checkEnters(t *testing.T, before, after tun.Stats, noURing bool, want uint64) {
	t.Helper()
	if noURing {
		want = 0
	}
	if got := after.URingEnters - before.URingEnters; got != want {
		t.Errorf("%d io_uring_enter calls, want %d", got, want)
	}
}

// checkWrites checks the write counters between two Stats.
func checkWrites(t *testing.T, before, after tun.Stats, writes, super, packets uint64) {
	t.Helper()
	w, s, p := after.Writes-before.Writes, after.SuperWrites-before.SuperWrites, after.WritePackets-before.WritePackets
	if w != writes || s != super || p != packets {
		t.Errorf("%d writes, %d super-packets, %d packets; want %d, %d and %d", w, s, p, writes, super, packets)
	}
}

// withOffset returns p behind off bytes of room.
func withOffset(off int, p []byte) []byte { return append(make([]byte, off), p...) }

// forwardingTUN creates a device in a namespace of its own that routes
// the networks 198.18.<n>.0/24 and 198.18.<n+1>.0/24 back into the TUN,
// so that what Write writes there is read again.
func forwardingTUN(t *testing.T, name string, n byte, noURing bool) *tun.Device {
	t.Helper()
	ns := testbed.NewNodeT(t, "tun")
	dev := createPath(t, ns, tun.Config{Name: name}, noURing)
	if err := ns.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []byte{n, n + 1} {
		ns.MustIP(t, "route", "add", netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, k, 0}), 24).String(), "dev", name)
	}
	return dev
}

// TestWriteEveryPacket writes a batch of TCP runs, each coalesced into a
// super-packet, between datagrams written alone, and a batch of more
// datagrams than the ring has entries, into a TUN that routes them back,
// and reads every packet back once, in each flow's order, on both paths:
// through io_uring, one io_uring_enter per ringful, and with writev(2).
func TestWriteEveryPacket(t *testing.T) {
	forEachPath(t, func(t *testing.T, noURing bool) {
		writeEveryPacket(t, forwardingTUN(t, "esptest5", 107, noURing), noURing)
	})
}

// writeEveryPacket is TestWriteEveryPacket on dev, which routes
// 198.18.107.0/24 and 198.18.108.0/24 back into itself.
func writeEveryPacket(t *testing.T, dev *tun.Device, noURing bool) {
	dst := netip.MustParseAddr("198.18.108.2")
	const off = 16
	t.Run("mixed", func(t *testing.T) {
		var bufs [][]byte
		for r := range 3 {
			src := netip.AddrFrom4([4]byte{198, 18, 107, byte(2 + r)})
			for i := range 10 {
				bufs = append(bufs, withOffset(off, tcpPkt(src, dst, uint32(1000+500*i), 0x10, make([]byte, 500))))
			}
			for i := range 5 {
				bufs = append(bufs, withOffset(off, udp4(netip.MustParseAddr("198.18.107.20"), dst, 40000, uint16(1000+5*r+i), 17, []byte("alone"))))
			}
		}
		before := dev.Stats()
		if err := dev.Write(bufs, off); err != nil {
			t.Fatal(err)
		}
		after := dev.Stats()
		checkWrites(t, before, after, 3+15, 3, 45)
		checkEnters(t, before, after, noURing, 1)
		got := readN(t, dev, 45, func(p []byte) bool { return len(p) > 20 && p[0] == 0x45 && netip.AddrFrom4([4]byte(p[16:20])) == dst })
		nextSeq := map[netip.Addr]uint32{}
		nextPort := 1000
		for _, p := range got {
			switch p[9] {
			case unix.IPPROTO_TCP:
				src := netip.AddrFrom4([4]byte(p[12:16]))
				want, ok := nextSeq[src]
				if !ok {
					want = 1000
				}
				if seq := binary.BigEndian.Uint32(p[24:]); seq != want || !l4Valid(p) {
					t.Fatalf("from %v: segment %d (checksum valid %v), want %d", src, seq, l4Valid(p), want)
				}
				nextSeq[src] = want + 500
			case unix.IPPROTO_UDP:
				if port := udpDstPort(p); port != nextPort {
					t.Fatalf("datagram to port %d, want %d", port, nextPort)
				}
				nextPort++
			}
		}
		if len(nextSeq) != 3 || nextPort != 1015 {
			t.Errorf("read %d flows of segments and %d datagrams", len(nextSeq), nextPort-1000)
		}
		for src, seq := range nextSeq {
			if seq != 1000+500*10 {
				t.Errorf("from %v: %d segments", src, (seq-1000)/500)
			}
		}
	})
	t.Run("more than a ringful", func(t *testing.T) {
		const n = 300 // ringEntries 128: three io_uring_enter
		var bufs [][]byte
		for i := range n {
			bufs = append(bufs, withOffset(off, udp4(netip.MustParseAddr("198.18.107.21"), dst, 40001, uint16(2000+i), 17, []byte("many"))))
		}
		before := dev.Stats()
		if err := dev.Write(bufs, off); err != nil {
			t.Fatal(err)
		}
		after := dev.Stats()
		checkWrites(t, before, after, n, 0, n)
		checkEnters(t, before, after, noURing, 3)
		got := readN(t, dev, n, func(p []byte) bool { return len(p) > 20 && p[0] == 0x45 && udpDstPort(p) >= 2000 })
		for i, p := range got {
			if udpDstPort(p) != 2000+i {
				t.Fatalf("datagram %d to port %d", i, udpDstPort(p))
			}
		}
	})
}

// TestWriteErrors writes a batch with two packets the kernel refuses
// (IP version 0: EINVAL) among good ones: on both paths the good ones
// are written and read back, each bad one fails Write with its errno and
// counts as a write and a packet, as with writev(2) today.
func TestWriteErrors(t *testing.T) {
	forEachPath(t, func(t *testing.T, noURing bool) {
		writeErrors(t, forwardingTUN(t, "esptest6", 109, noURing), noURing)
	})
}

// writeErrors is TestWriteErrors on dev, which routes 198.18.109.0/24 and
// 198.18.110.0/24 back into itself.
func writeErrors(t *testing.T, dev *tun.Device, noURing bool) {
	src, dst := netip.MustParseAddr("198.18.109.2"), netip.MustParseAddr("198.18.110.2")
	const off = 16
	var bufs [][]byte
	port := uint16(3000)
	for i := range 8 {
		if i == 3 || i == 6 {
			bufs = append(bufs, withOffset(off, make([]byte, 40)))
			continue
		}
		bufs = append(bufs, withOffset(off, udp4(src, dst, 40000, port, 17, []byte("good"))))
		port++
	}
	before := dev.Stats()
	err := dev.Write(bufs, off)
	after := dev.Stats()
	if !errors.Is(err, unix.EINVAL) {
		t.Fatalf("Write: %v, want EINVAL", err)
	}
	if j, ok := err.(interface{ Unwrap() []error }); !ok || len(j.Unwrap()) != 2 {
		t.Errorf("Write: %v, want the two packets' errors joined", err)
	}
	checkWrites(t, before, after, 8, 0, 8)
	checkEnters(t, before, after, noURing, 1)
	got := readN(t, dev, 6, func(p []byte) bool { return len(p) > 20 && p[0] == 0x45 && netip.AddrFrom4([4]byte(p[16:20])) == dst })
	for i, p := range got {
		if udpDstPort(p) != 3000+i {
			t.Errorf("datagram %d to port %d", i, udpDstPort(p))
		}
	}
}

// TestWriteClose closes the device while a goroutine writes batches: the
// writer's Writes end with os.ErrClosed, as do those after Close, on both
// paths, and the ring is gone with the device.
func TestWriteClose(t *testing.T) {
	forEachPath(t, func(t *testing.T, noURing bool) {
		dev := forwardingTUN(t, "esptest7", 111, noURing)
		src, dst := netip.MustParseAddr("198.18.111.2"), netip.MustParseAddr("198.18.112.2")
		const off = 16
		var bufs [][]byte
		for i := range 8 {
			bufs = append(bufs, withOffset(off, udp4(src, dst, 40000, uint16(4000+i), 17, []byte("close"))))
		}
		var wg sync.WaitGroup
		started := make(chan struct{})
		var last error
		wg.Go(func() {
			for i := 0; ; i++ {
				if i == 10 {
					close(started)
				}
				if last = dev.Write(bufs, off); last != nil {
					if i < 10 {
						close(started)
					}
					return
				}
			}
		})
		<-started
		if err := dev.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if !errors.Is(last, os.ErrClosed) {
			t.Errorf("the writer's last Write: %v, want os.ErrClosed", last)
		}
		if err := dev.Write(bufs, off); !errors.Is(err, os.ErrClosed) {
			t.Errorf("Write after Close: %v, want os.ErrClosed", err)
		}
		if err := dev.URingErr(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("URingErr after Close: %v, want os.ErrClosed", err)
		}
	})
}
