package tun_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/packet"
	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// tcpPkt builds an IPv4 or IPv6 TCP segment with valid checksums and a
// timestamp option, as a Linux sender's would be.
func tcpPkt(src, dst netip.Addr, seq uint32, flags byte, payload []byte) []byte {
	hl := 20
	if src.Is6() {
		hl = 40
	}
	const thl = 32
	p := make([]byte, hl+thl+len(payload))
	if src.Is4() {
		p[0] = 0x45
		binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
		p[6] = 0x40 // DF
		p[8] = 64
		p[9] = unix.IPPROTO_TCP
		s, d := src.As4(), dst.As4()
		copy(p[12:], s[:])
		copy(p[16:], d[:])
		binary.BigEndian.PutUint16(p[10:], packet.Checksum(p[:20], 0))
	} else {
		p[0] = 0x60
		binary.BigEndian.PutUint16(p[4:], uint16(len(p)-40))
		p[6] = unix.IPPROTO_TCP
		p[7] = 64
		s, d := src.As16(), dst.As16()
		copy(p[8:], s[:])
		copy(p[24:], d[:])
	}
	t := p[hl:]
	binary.BigEndian.PutUint16(t[0:], 40000)
	binary.BigEndian.PutUint16(t[2:], 5201)
	binary.BigEndian.PutUint32(t[4:], seq)
	binary.BigEndian.PutUint32(t[8:], 77)
	t[12] = thl / 4 << 4
	t[13] = flags
	binary.BigEndian.PutUint16(t[14:], 500)
	copy(t[20:], []byte{1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 7}) // NOP NOP timestamps
	copy(t[thl:], payload)
	addrs := p[12:20]
	if src.Is6() {
		addrs = p[8:40]
	}
	pseudo := packet.Sum(addrs, uint32(unix.IPPROTO_TCP)+uint32(len(t)))
	binary.BigEndian.PutUint16(t[16:], packet.Checksum(t, pseudo))
	return p
}

// l4Valid checks the transport checksum of an IPv4 or IPv6 packet.
func l4Valid(p []byte) bool {
	hl, addrs, proto := 20, p[12:20], p[9]
	if p[0]>>4 == 6 {
		hl, addrs, proto = 40, p[8:40], p[6]
	}
	return packet.Checksum(p[hl:], packet.Sum(addrs, uint32(proto)+uint32(len(p)-hl))) == 0
}

// TestCoalesceAndSplit writes runs of TCP segments into the TUN, routed
// back into it, and reads them again: each run must cross the kernel as
// one super-packet (one write, one read) and come back as the same
// segments, forwarded (TTL or hop limit one less) with valid checksums,
// also when a small MSS makes it longer than a Read's batch. A segment
// with a bad checksum and a FIN are written alone, in their place.
func TestCoalesceAndSplit(t *testing.T) { forEachPath(t, testCoalesceAndSplit) }

func testCoalesceAndSplit(t *testing.T, noURing bool) {
	ns := testbed.NewNodeT(t, "tun")
	dev := createPath(t, ns, tun.Config{Name: "esptest3"}, noURing)
	for _, k := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		if err := ns.Sysctl(k, "1"); err != nil {
			t.Fatal(err)
		}
	}
	ns.MustIP(t, "route", "add", "198.18.103.0/24", "dev", "esptest3")
	ns.MustIP(t, "route", "add", "198.18.104.0/24", "dev", "esptest3")
	ns.MustIP(t, "-6", "route", "add", "2001:db8:103::/48", "dev", "esptest3")
	ns.MustIP(t, "-6", "route", "add", "2001:db8:104::/48", "dev", "esptest3")

	for _, tc := range []struct {
		name     string
		src, dst netip.Addr
		n, mss   int
	}{
		{"IPv4", netip.MustParseAddr("198.18.103.2"), netip.MustParseAddr("198.18.104.2"), 40, 1200},
		{"IPv6", netip.MustParseAddr("2001:db8:103::2"), netip.MustParseAddr("2001:db8:104::2"), 40, 1200},
		{"IPv4 small MSS", netip.MustParseAddr("198.18.103.3"), netip.MustParseAddr("198.18.104.3"), 300, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const off = 16
			var bufs [][]byte
			var sent [][]byte
			seq := uint32(1000)
			for i := range tc.n {
				pl := make([]byte, tc.mss)
				for j := range pl {
					pl[j] = byte(i + j)
				}
				p := tcpPkt(tc.src, tc.dst, seq, 0x10, pl)
				seq += uint32(len(pl))
				sent = append(sent, p)
				bufs = append(bufs, append(make([]byte, off), p...))
			}
			before := dev.Stats()
			if err := dev.Write(bufs, off); err != nil {
				t.Fatal(err)
			}
			w := dev.Stats()
			if w.Writes-before.Writes != 1 || w.SuperWrites-before.SuperWrites != 1 || w.WritePackets-before.WritePackets != uint64(tc.n) {
				t.Errorf("%d packets written in %d writes (%d super-packets)", tc.n, w.Writes-before.Writes, w.SuperWrites-before.SuperWrites)
			}
			got := readN(t, dev, tc.n, func(p []byte) bool {
				return len(p) > 20 && string(addrs(p)[len(addrs(p))/2:]) == string(tc.dst.AsSlice())
			})
			for i, p := range got {
				want := sent[i]
				if len(p) != len(want) || !l4Valid(p) {
					t.Fatalf("segment %d: %d bytes (want %d), checksum valid %v", i, len(p), len(want), l4Valid(p))
				}
				hl := 20
				if tc.src.Is6() {
					hl = 40
				}
				if string(p[hl:hl+16]) != string(want[hl:hl+16]) || string(p[hl+18:]) != string(want[hl+18:]) {
					t.Fatalf("segment %d differs from what was written", i)
				}
				if ttl := map[bool]int{true: 8, false: 7}[tc.src.Is4()]; p[ttl] != want[ttl]-1 {
					t.Fatalf("segment %d: TTL %d, want %d", i, p[ttl], want[ttl]-1)
				}
			}
			r := dev.Stats()
			if r.SuperReads-w.SuperReads != 1 {
				t.Errorf("read back in %d super-packets, want 1", r.SuperReads-w.SuperReads)
			}
		})
	}

	t.Run("alone", func(t *testing.T) {
		src, dst := netip.MustParseAddr("198.18.103.4"), netip.MustParseAddr("198.18.104.4")
		const off = 16
		var bufs [][]byte
		var seqs []uint32
		seq := uint32(5000)
		for i := range 6 {
			flags := byte(0x10)
			if i == 5 {
				flags |= 0x01 // FIN
			}
			p := tcpPkt(src, dst, seq, flags, make([]byte, 500))
			if i == 2 {
				p[len(p)-1] ^= 0xff // bad checksum
			}
			seqs = append(seqs, seq)
			seq += 500
			bufs = append(bufs, append(make([]byte, off), p...))
		}
		before := dev.Stats()
		if err := dev.Write(bufs, off); err != nil {
			t.Fatal(err)
		}
		// [0 1] [2 bad] [3 4] [5 FIN]
		w := dev.Stats()
		if w.Writes-before.Writes != 4 || w.SuperWrites-before.SuperWrites != 2 || w.WritePackets-before.WritePackets != 6 {
			t.Errorf("%d writes, %d super-packets, %d packets; want 4, 2 and 6", w.Writes-before.Writes, w.SuperWrites-before.SuperWrites, w.WritePackets-before.WritePackets)
		}
		checkEnters(t, before, w, noURing, 1)
		got := readN(t, dev, 6, func(p []byte) bool { return len(p) > 20 && string(p[16:20]) == string(dst.AsSlice()) })
		for i, p := range got {
			if s := binary.BigEndian.Uint32(p[20+4:]); s != seqs[i] {
				t.Errorf("packet %d has sequence number %d, want %d", i, s, seqs[i])
			}
			if valid := l4Valid(p); valid != (i != 2) {
				t.Errorf("packet %d: checksum valid %v", i, valid)
			}
		}
	})
}

func addrs(p []byte) []byte {
	if p[0]>>4 == 6 {
		return p[8:40]
	}
	return p[12:20]
}

// readN reads until n packets that match arrived, with batches of
// dev.BatchSize(), for at most 5 seconds.
func readN(t *testing.T, dev *tun.Device, n int, match func([]byte) bool) [][]byte {
	t.Helper()
	const off = 80
	bufs := make([][]byte, dev.BatchSize())
	sizes := make([]int, len(bufs))
	for i := range bufs {
		bufs[i] = make([]byte, off+dev.MTU())
	}
	c := make(chan error, 1)
	var got [][]byte
	go func() {
		for len(got) < n {
			k, err := dev.Read(bufs, sizes, off)
			if err != nil {
				c <- err
				return
			}
			for i := range k {
				if p := bufs[i][off : off+sizes[i]]; match(p) {
					got = append(got, append([]byte(nil), p...))
				}
			}
		}
		c <- nil
	}()
	select {
	case err := <-c:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		dev.Close()
		err := <-c
		t.Fatalf("%d of %d packets read in 5 s (%v)", len(got), n, err)
	}
	if len(got) != n {
		t.Fatal(errors.New(fmt.Sprint(len(got), " packets")))
	}
	return got
}

// TestReadBatchesSmallPackets forwards packets that the kernel hands to
// the TUN one by one (datagrams of different flows) and expects one Read
// to return all that are queued, not one per call.
func TestReadBatchesSmallPackets(t *testing.T) { forEachPath(t, testReadBatchesSmallPackets) }

func testReadBatchesSmallPackets(t *testing.T, noURing bool) {
	ns := testbed.NewNodeT(t, "tun")
	dev := createPath(t, ns, tun.Config{Name: "esptest4"}, noURing)
	if err := ns.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	ns.MustIP(t, "route", "add", "198.18.105.0/24", "dev", "esptest4")
	ns.MustIP(t, "route", "add", "198.18.106.0/24", "dev", "esptest4")
	src, dst := netip.MustParseAddr("198.18.105.2"), netip.MustParseAddr("198.18.106.2")
	const n = 8
	var bufs [][]byte
	for i := range n {
		bufs = append(bufs, append(make([]byte, 16), udp4(src, dst, 40000, uint16(1000+i), 17, []byte("small"))...))
	}
	before := dev.Stats()
	if err := dev.Write(bufs, 16); err != nil {
		t.Fatal(err)
	}
	checkEnters(t, before, dev.Stats(), noURing, 1)
	const off = 80
	rb := make([][]byte, dev.BatchSize())
	sizes := make([]int, len(rb))
	for i := range rb {
		rb[i] = make([]byte, off+dev.MTU())
	}
	got := 0
	deadline := time.AfterFunc(5*time.Second, func() { dev.Close() })
	defer deadline.Stop()
	for got < n {
		k, err := dev.Read(rb, sizes, off)
		if err != nil {
			t.Fatalf("after %d packets: %v", got, err)
		}
		first := got
		for i := range k {
			p := rb[i][off : off+sizes[i]]
			if len(p) < 20 || p[0]>>4 != 4 || netip.AddrFrom4([4]byte(p[16:20])) != dst {
				continue // the kernel's own (IPv6 router solicitations, ...)
			}
			if udpDstPort(p) != 1000+got {
				t.Fatalf("packet %d: destination port %d", got, udpDstPort(p))
			}
			got++
		}
		if first == 0 && got > 0 && got != n {
			t.Errorf("the first Read with our packets returned %d of the %d queued", got, n)
		}
	}
}
