package tun_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/packet"
	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// udp4 builds an IPv4/UDP packet with valid checksums.
func udp4(src, dst netip.Addr, sport, dport uint16, ttl uint8, payload []byte) []byte {
	p := make([]byte, 28+len(payload))
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	p[8] = ttl
	p[9] = unix.IPPROTO_UDP
	s, d := src.As4(), dst.As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	binary.BigEndian.PutUint16(p[10:], packet.Checksum(p[:20], 0))
	u := p[20:]
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
	copy(u[8:], payload)
	pseudo := packet.Sum(p[12:20], uint32(unix.IPPROTO_UDP)+uint32(len(u)))
	binary.BigEndian.PutUint16(u[6:], packet.Checksum(u, pseudo))
	return p
}

// udpConnIn opens a UDP socket of network ("udp4", "udp6") in ns, closed
// at the test's end.
func udpConnIn(t *testing.T, ns *testbed.Node, network string) *net.UDPConn {
	t.Helper()
	var conn *net.UDPConn
	if err := ns.Do(func() (err error) {
		conn, err = net.ListenUDP(network, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func createIn(t *testing.T, ns *testbed.Node, cfg tun.Config) *tun.Device {
	t.Helper()
	var dev *tun.Device
	err := ns.Do(func() (err error) {
		dev, err = tun.Create(cfg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// readUntil reads batches from dev until match accepts a packet, for at
// most 50 reads and 5 seconds. It returns the sizes of the packets of the
// matching batch that match.
func readUntil(t *testing.T, dev *tun.Device, match func([]byte) bool) [][]byte {
	t.Helper()
	const off = 80
	bufs := make([][]byte, dev.BatchSize())
	sizes := make([]int, len(bufs))
	for i := range bufs {
		bufs[i] = make([]byte, off+dev.MTU())
	}
	type result struct {
		pkts [][]byte
		err  error
	}
	c := make(chan result, 1)
	go func() {
		for range 50 {
			n, err := dev.Read(bufs, sizes, off)
			if err != nil && !errors.Is(err, tun.ErrTooManySegments) {
				c <- result{err: err}
				return
			}
			var got [][]byte
			for i := range n {
				if p := bufs[i][off : off+sizes[i]]; match(p) {
					got = append(got, append([]byte(nil), p...))
				}
			}
			if len(got) > 0 {
				c <- result{pkts: got}
				return
			}
		}
		c <- result{err: errors.New("no matching packet in 50 reads")}
	}()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.pkts
	case <-time.After(5 * time.Second):
		dev.Close() // unblocks the reader
		<-c
		t.Fatal("timed out reading from the TUN")
		return nil
	}
}

func TestCreateUpAndMTU(t *testing.T) { forEachPath(t, testCreateUpAndMTU) }

func testCreateUpAndMTU(t *testing.T, noURing bool) {
	ns := testbed.NewNodeT(t, "tun")
	dev := createPath(t, ns, tun.Config{Name: "esptest0", MTU: 1380}, noURing)
	if dev.Name() != "esptest0" || dev.MTU() != 1380 || dev.Index() <= 0 {
		t.Fatalf("name %q mtu %d index %d", dev.Name(), dev.MTU(), dev.Index())
	}
	if dev.BatchSize() < 2 {
		t.Errorf("BatchSize %d: the driver did not enable IFF_VNET_HDR offloads", dev.BatchSize())
	}
	out := ns.MustIP(t, "-o", "link", "show", "esptest0")
	for _, want := range []string{"mtu 1380", ",UP"} {
		if !strings.Contains(out, want) {
			t.Errorf("link %q lacks %q", out, want)
		}
	}
	if err := dev.Write([][]byte{make([]byte, 100)}, 8); err == nil {
		t.Error("Write accepted an offset below MinWriteOffset")
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.IP(context.Background(), "link", "show", "esptest0"); err == nil {
		t.Error("interface still exists after Close")
	}
	if err := dev.Write([][]byte{make([]byte, 100)}, 16); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Write after Close: %v, want os.ErrClosed", err)
	}
}

func TestDefaults(t *testing.T) {
	ns := testbed.NewNodeT(t, "tun")
	dev := createIn(t, ns, tun.Config{})
	if dev.Name() != tun.DefaultName || dev.MTU() != tun.DefaultMTU {
		t.Fatalf("defaults: %q %d", dev.Name(), dev.MTU())
	}
	if _, err := tun.Create(tun.Config{MTU: 100}); err == nil {
		t.Error("MTU 100 accepted")
	}
	if _, err := tun.Create(tun.Config{Name: "a-name-far-too-long"}); err == nil {
		t.Error("17-byte name accepted")
	}
}

// TestForwardBack writes a packet into the TUN whose destination the
// namespace routes back into the TUN, and reads the forwarded packet.
func TestForwardBack(t *testing.T) { forEachPath(t, testForwardBack) }

func testForwardBack(t *testing.T, noURing bool) {
	ns := testbed.NewNodeT(t, "tun")
	dev := createPath(t, ns, tun.Config{Name: "esptest1"}, noURing)
	if err := ns.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	ns.MustIP(t, "route", "add", "198.18.99.0/24", "dev", "esptest1")
	ns.MustIP(t, "route", "add", "198.18.100.0/24", "dev", "esptest1")

	src, dst := netip.MustParseAddr("198.18.99.2"), netip.MustParseAddr("198.18.100.5")
	pkt := udp4(src, dst, 40000, 9, 17, []byte("espd tun test"))
	buf := make([]byte, 16+len(pkt))
	copy(buf[16:], pkt)
	if err := dev.Write([][]byte{buf}, 16); err != nil {
		t.Fatal(err)
	}
	got := readUntil(t, dev, func(p []byte) bool {
		return len(p) == len(pkt) && p[0] == 0x45 && netip.AddrFrom4([4]byte(p[16:20])) == dst
	})
	if got[0][8] != 16 {
		t.Errorf("forwarded TTL %d, want 16", got[0][8])
	}
	if string(got[0][28:]) != "espd tun test" {
		t.Errorf("payload %q", got[0][28:])
	}
}

// TestGSOSplit sends one UDP GSO super-packet (UDP_SEGMENT) from a socket
// in the namespace through a route into the TUN and expects Read to return
// its segments as separate packets in one batch.
func TestGSOSplit(t *testing.T) {
	ns := testbed.NewNodeT(t, "tun")
	dev := createIn(t, ns, tun.Config{Name: "esptest2"})
	ns.MustIP(t, "addr", "add", "198.18.101.1/32", "dev", "lo")
	ns.MustIP(t, "route", "add", "198.18.102.0/24", "dev", "esptest2", "src", "198.18.101.1")
	ns.MustIP(t, "-6", "addr", "add", "2001:db8:101::1/128", "dev", "lo", "nodad")
	ns.MustIP(t, "-6", "route", "add", "2001:db8:102::/48", "dev", "esptest2", "src", "2001:db8:101::1")

	for _, tc := range []struct {
		network, dst string
		v            byte
	}{
		{"udp4", "198.18.102.7:7777", 4},
		{"udp6", "[2001:db8:102::7]:7777", 6},
	} {
		conn := udpConnIn(t, ns, tc.network)
		raddr := net.UDPAddrFromAddrPort(netip.MustParseAddrPort(tc.dst))
		const seg = 500
		payload := make([]byte, 3*seg)
		for i := range payload {
			payload[i] = byte(i / seg)
		}
		oob := udpSegment(seg)
		if _, _, err := conn.WriteMsgUDP(payload, oob, raddr); err != nil {
			t.Fatalf("%s GSO send: %v", tc.network, err)
		}
		got := readUntil(t, dev, func(p []byte) bool {
			return len(p) > 0 && p[0]>>4 == tc.v && udpDstPort(p) == 7777
		})
		if len(got) != 3 {
			t.Fatalf("%s: one Read returned %d segments, want 3", tc.network, len(got))
		}
		for i, p := range got {
			pl := p[len(p)-seg:]
			if pl[0] != byte(i) || pl[seg-1] != byte(i) {
				t.Errorf("%s segment %d carries segment %d's bytes", tc.network, i, pl[0])
			}
		}
	}
}

func udpDstPort(p []byte) int {
	switch p[0] >> 4 {
	case 4:
		ihl := int(p[0]&0xf) * 4
		if p[9] != unix.IPPROTO_UDP || len(p) < ihl+8 {
			return -1
		}
		return int(binary.BigEndian.Uint16(p[ihl+2:]))
	case 6:
		if p[6] != unix.IPPROTO_UDP || len(p) < 48 {
			return -1
		}
		return int(binary.BigEndian.Uint16(p[42:]))
	}
	return -1
}

// udpSegment is a UDP_SEGMENT control message asking for GSO in segments
// of size bytes.
func udpSegment(size uint16) []byte {
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level = unix.SOL_UDP
	h.Type = unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], size)
	return oob
}
