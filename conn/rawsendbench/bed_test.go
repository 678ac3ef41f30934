package rawsendbench

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/testbed"
)

// The line: namespace a (198.18.210.1 on veth a0) sends to namespace b
// (198.18.210.2 on b0).
var (
	srcIP = [4]byte{198, 18, 210, 1}
	dstIP = [4]byte{198, 18, 210, 2}
)

const (
	pktLen = 1400
	batch  = 64
)

// bed is the two namespaces, b's raw ESP socket, and what a sender in a
// needs to address b.
type bed struct {
	a, b    *testbed.Node
	ifindex int     // a0's index in a
	dstMAC  [6]byte // b0's address
	rx      int     // b's raw ESP socket
}

func newBed(tb testing.TB) *bed {
	tb.Helper()
	a, b := testbed.NewNodeT(tb, "rsa"), testbed.NewNodeT(tb, "rsb")
	testbed.VethT(tb, a, "a0", b, "b0")
	a.MustIP(tb, "addr", "add", "198.18.210.1/24", "dev", "a0")
	b.MustIP(tb, "addr", "add", "198.18.210.2/24", "dev", "b0")
	a.MustIP(tb, "link", "set", "a0", "up")
	b.MustIP(tb, "link", "set", "b0", "up")
	bd := &bed{a: a, b: b}
	if err := b.Do(func() error {
		ifc, err := net.InterfaceByName("b0")
		if err != nil {
			return err
		}
		copy(bd.dstMAC[:], ifc.HardwareAddr)
		bd.rx, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_ESP)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Close(bd.rx) })
	if err := a.Do(func() error {
		ifc, err := net.InterfaceByName("a0")
		if err != nil {
			return err
		}
		bd.ifindex = ifc.Index
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	// A permanent neighbour entry: no ARP on either path.
	a.MustIP(tb, "neigh", "replace", "198.18.210.2", "lladdr", net.HardwareAddr(bd.dstMAC[:]).String(), "dev", "a0", "nud", "permanent")
	return bd
}

// socketIn opens a socket in n.
func socketIn(tb testing.TB, n *testbed.Node, domain, typ, proto int) int {
	tb.Helper()
	var fd int
	if err := n.Do(func() (err error) {
		fd, err = unix.Socket(domain, typ|unix.SOCK_CLOEXEC, proto)
		return err
	}); err != nil {
		tb.Fatalf("socket(%d, %d, %d): %v", domain, typ, proto, err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	return fd
}

// espPacket is an IPv4 packet of pktLen bytes carrying ESP with SPI spi
// and sequence number seq, its header checksum set.
func espPacket(spi, seq uint32) []byte {
	p := make([]byte, pktLen)
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], pktLen)
	p[6] = 0x40 // DF
	p[8] = 64
	p[9] = unix.IPPROTO_ESP
	copy(p[12:], srcIP[:])
	copy(p[16:], dstIP[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(p[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(p[10:], ^uint16(sum))
	binary.BigEndian.PutUint32(p[20:], spi)
	binary.BigEndian.PutUint32(p[24:], seq)
	for i := 28; i < len(p); i++ {
		p[i] = byte(i)
	}
	return p
}

// sender sends batches of packets one way.
type sender interface {
	send(pkts [][]byte) error
}

// mmsgSender is sendmmsg on fd with one address for every message.
type mmsgSender struct {
	fd   int
	hdrs []unix.Mmsghdr
	iovs []unix.Iovec
	name unsafe.Pointer
	nlen uint32
}

func newMmsgSender(fd int, name unsafe.Pointer, nlen uint32) *mmsgSender {
	return &mmsgSender{fd: fd, hdrs: make([]unix.Mmsghdr, batch), iovs: make([]unix.Iovec, batch), name: name, nlen: nlen}
}

func (s *mmsgSender) send(pkts [][]byte) error {
	for i, p := range pkts {
		s.iovs[i] = unix.Iovec{Base: &p[0]}
		s.iovs[i].SetLen(len(p))
		h := &s.hdrs[i].Hdr
		h.Name, h.Namelen = (*byte)(s.name), s.nlen
		h.Iov = &s.iovs[i]
		h.SetIovlen(1)
	}
	for off := 0; off < len(pkts); {
		n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&s.hdrs[off])), uintptr(len(pkts)-off), 0, 0, 0)
		if e != 0 {
			return fmt.Errorf("sendmmsg: %w", e)
		}
		off += int(n)
	}
	return nil
}

// rawIPSender is conn's raw ESP path: an IPPROTO_RAW socket (IP_HDRINCL).
func rawIPSender(tb testing.TB, bd *bed) sender {
	fd := socketIn(tb, bd.a, unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	sa := &unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: dstIP}
	return newMmsgSender(fd, unsafe.Pointer(sa), unix.SizeofSockaddrInet4)
}

// packetAddr is a0's link-layer address of b0, for IPv4.
func packetAddr(bd *bed) *unix.RawSockaddrLinklayer {
	sll := &unix.RawSockaddrLinklayer{Family: unix.AF_PACKET, Protocol: htons(unix.ETH_P_IP), Ifindex: int32(bd.ifindex), Halen: 6}
	copy(sll.Addr[:], bd.dstMAC[:])
	return sll
}

// packetSender is AF_PACKET SOCK_DGRAM with sendmmsg; bypass sets
// PACKET_QDISC_BYPASS.
func packetSender(tb testing.TB, bd *bed, bypass bool) sender {
	fd := socketIn(tb, bd.a, unix.AF_PACKET, unix.SOCK_DGRAM, 0)
	if bypass {
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
			tb.Fatal(err)
		}
	}
	return newMmsgSender(fd, unsafe.Pointer(packetAddr(bd)), unix.SizeofSockaddrLinklayer)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// bedAvailable says why the namespaces cannot be made here, if so.
func bedAvailable() error { return testbed.Available() }
