package uringbench

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/espd/espd/packet"
	"github.com/espd/espd/testbed"
	"golang.org/x/sys/unix"
)

// The addresses of the bed: the TUN has local on a /24, and the packets
// come from peer, a host behind the TUN, to local's UDP port sinkPort.
var (
	local = netip.MustParseAddr("198.18.0.1")
	peer  = netip.MustParseAddr("198.18.0.2")
)

const (
	tunName  = "urb0"
	sinkPort = 9
	srcPort  = 40000
)

// bed is a TUN in a namespace of its own and a UDP socket bound to the
// packets' destination.
type bed struct {
	node *testbed.Node
	tun  int // the TUN's file descriptor (IFF_TUN|IFF_NO_PI, blocking)
	sink int // the UDP socket the packets are addressed to
}

// newBed creates the namespace, the TUN (198.18.0.1/24, up) and the sink
// socket, with a receive buffer of rcvbuf bytes.
func newBed(tb testing.TB, rcvbuf int) *bed {
	tb.Helper()
	b := &bed{node: testbed.NewNodeT(tb, "uring"), tun: -1, sink: -1}
	tb.Cleanup(func() {
		if b.tun >= 0 {
			unix.Close(b.tun)
		}
		if b.sink >= 0 {
			unix.Close(b.sink)
		}
	})
	err := b.node.Do(func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		b.tun = fd
		ifr, err := unix.NewIfreq(tunName)
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return fmt.Errorf("TUNSETIFF: %w", err)
		}
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		b.sink = s
		if err := unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvbuf); err != nil {
			return fmt.Errorf("SO_RCVBUFFORCE: %w", err)
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	b.node.MustIP(tb, "addr", "add", local.String()+"/24", "dev", tunName)
	b.node.MustIP(tb, "link", "set", tunName, "up")
	// Bind once the address exists.
	if err := unix.Bind(b.sink, &unix.SockaddrInet4{Port: sinkPort, Addr: local.As4()}); err != nil {
		tb.Fatalf("bind %v:%d: %v", local, sinkPort, err)
	}
	return b
}

// packets returns n valid IPv4/UDP packets of size bytes from peer to
// local's sinkPort, each in its own buffer, carrying its index in the
// first 8 bytes of its payload.
func packets(tb testing.TB, n, size int) [][]byte {
	tb.Helper()
	hdr := packet.IPv4HeaderLen + packet.UDPHeaderLen
	if size < hdr+8 {
		tb.Fatalf("packet size %d below %d", size, hdr+8)
	}
	pkts := make([][]byte, n)
	for i := range pkts {
		p := make([]byte, size)
		if _, err := packet.PutIPv4Header(p, packet.IPv4Header{
			TotalLen: uint16(size), ID: uint16(i), DF: true, TTL: 64,
			Protocol: packet.ProtoUDP, Src: peer, Dst: local,
		}); err != nil {
			tb.Fatal(err)
		}
		udp := p[packet.IPv4HeaderLen:]
		if _, err := packet.PutUDPHeader(udp, srcPort, sinkPort, size-hdr); err != nil {
			tb.Fatal(err)
		}
		binary.BigEndian.PutUint64(p[hdr:], uint64(i))
		for j := hdr + 8; j < size; j++ {
			p[j] = byte(j)
		}
		if err := packet.SetUDPChecksum(udp, peer, local); err != nil {
			tb.Fatal(err)
		}
		pkts[i] = p
	}
	return pkts
}

// writeOne writes each of pkts with its own system call, as
// tun.(*Device).writeOne does for a packet it does not coalesce: writev(2)
// of one iovec through unix.RawSyscall (a TUN write never blocks, so espd
// skips the scheduler's entersyscall/exitsyscall).
func writeOne(fd int, pkts [][]byte) error {
	var iov [1]unix.Iovec
	for i, p := range pkts {
		iov[0].Base = &p[0]
		iov[0].SetLen(len(p))
		n, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), 1)
		if e != 0 {
			return fmt.Errorf("write %d: %w", i, e)
		}
		if int(n) != len(p) {
			return fmt.Errorf("write %d: wrote %d of %d bytes", i, n, len(p))
		}
	}
	return nil
}

// counters reads, inside the namespace, the TUN's received-packet count
// (the packets written to it) and the UDP counters of /proc/net/snmp.
type counters struct {
	tunRx        uint64
	udpIn        uint64 // InDatagrams
	udpRcvbufErr uint64 // RcvbufErrors
}

func (b *bed) counters(tb testing.TB) counters {
	tb.Helper()
	var c counters
	err := b.node.Do(func() error {
		dev, err := os.ReadFile("/proc/thread-self/net/dev")
		if err != nil {
			return err
		}
		found := false
		for line := range strings.Lines(string(dev)) {
			name, rest, ok := strings.Cut(line, ":")
			if !ok || strings.TrimSpace(name) != tunName {
				continue
			}
			f := strings.Fields(rest) // rx bytes, rx packets, ...
			if len(f) < 2 {
				return fmt.Errorf("/proc/net/dev: short line %q", line)
			}
			if c.tunRx, err = strconv.ParseUint(f[1], 10, 64); err != nil {
				return err
			}
			found = true
		}
		if !found {
			return fmt.Errorf("/proc/net/dev: no %s", tunName)
		}
		snmp, err := os.Open("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		defer snmp.Close()
		var names []string
		sc := bufio.NewScanner(snmp)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 0 || f[0] != "Udp:" {
				continue
			}
			if names == nil {
				names = f
				continue
			}
			for i := 1; i < len(f) && i < len(names); i++ {
				v, err := strconv.ParseUint(f[i], 10, 64)
				if err != nil {
					return err
				}
				switch names[i] {
				case "InDatagrams":
					c.udpIn = v
				case "RcvbufErrors":
					c.udpRcvbufErr = v
				}
			}
		}
		if names == nil {
			return fmt.Errorf("/proc/net/snmp: no Udp lines")
		}
		return sc.Err()
	})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// requireRing sets up an io_uring of entries, or skips the test when the
// kernel refuses it; under CI=true it fails instead, with the errno.
func requireRing(tb testing.TB, entries uint32) *ring {
	tb.Helper()
	r, err := newRing(entries)
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("io_uring unavailable: %v", err)
		}
		tb.Skipf("io_uring unavailable: %v", err)
	}
	tb.Cleanup(r.close)
	return r
}

// ioWorkers counts the process's io_uring worker threads (iou-wrk-*): the
// kernel starts them when it cannot complete a write inline.
func ioWorkers(tb testing.TB) int {
	tb.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, t := range tasks {
		comm, err := os.ReadFile("/proc/self/task/" + t.Name() + "/comm")
		if err == nil && strings.HasPrefix(string(comm), "iou-wrk") {
			n++
		}
	}
	return n
}
