package testbed

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// InjectIP sends the IPv4 or IPv6 packet pkt, header included, out of the
// namespace as it is (a raw socket with the header included). The kernel
// routes it by its destination; for IPv4 it fills in a zero checksum and
// identification and always sets the total length. It is meant for
// replaying, tampering with and forging packets on a link such as transit.
func (n *Node) InjectIP(pkt []byte) error { return n.InjectIPMarked(pkt, 0) }

// InjectIPMarked is InjectIP with the socket's SO_MARK set to mark (if not
// 0): with espd's mark the packet skips espd's routing table, as a forger
// on the link would, rather than being routed into the namespace's espd.
func (n *Node) InjectIPMarked(pkt []byte, mark uint32) error {
	if len(pkt) < 1 {
		return errors.New("testbed: empty packet")
	}
	var domain int
	var to unix.Sockaddr
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < 20 {
			return errors.New("testbed: IPv4 packet shorter than its header")
		}
		domain, to = unix.AF_INET, &unix.SockaddrInet4{Addr: [4]byte(pkt[16:20])}
	case 6:
		if len(pkt) < 40 {
			return errors.New("testbed: IPv6 packet shorter than its header")
		}
		domain, to = unix.AF_INET6, &unix.SockaddrInet6{Addr: [16]byte(pkt[24:40])}
	default:
		return fmt.Errorf("testbed: IP version %d", pkt[0]>>4)
	}
	return n.Do(func() error {
		// IPPROTO_RAW implies the header is included, in both families.
		fd, err := unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("testbed: raw socket in %s: %w", n.Name, err)
		}
		defer unix.Close(fd)
		if mark != 0 {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(mark)); err != nil {
				return fmt.Errorf("testbed: SO_MARK in %s: %w", n.Name, err)
			}
		}
		if err := unix.Sendto(fd, pkt, 0, to); err != nil {
			return fmt.Errorf("testbed: inject %d bytes from %s: %w", len(pkt), n.Name, err)
		}
		return nil
	})
}

// BuildIP returns an IPv4 or IPv6 packet (after src's family) from src to
// dst carrying payload as protocol proto, with TTL / hop limit 64 and, for
// IPv4, DF clear and a valid header checksum.
func BuildIP(src, dst netip.Addr, proto uint8, payload []byte) ([]byte, error) {
	switch {
	case src.Is4() && dst.Is4():
		if len(payload) > 65535-20 {
			return nil, errors.New("testbed: payload too long for IPv4")
		}
		p := make([]byte, 20+len(payload))
		p[0] = 0x45
		binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
		p[8] = 64
		p[9] = proto
		s, d := src.As4(), dst.As4()
		copy(p[12:], s[:])
		copy(p[16:], d[:])
		binary.BigEndian.PutUint16(p[10:], ^fold(sum32(0, p[:20])))
		copy(p[20:], payload)
		return p, nil
	case src.Is6() && dst.Is6() && !src.Is4In6() && !dst.Is4In6():
		if len(payload) > 65535 {
			return nil, errors.New("testbed: payload too long for IPv6")
		}
		p := make([]byte, 40+len(payload))
		p[0] = 0x60
		binary.BigEndian.PutUint16(p[4:], uint16(len(payload)))
		p[6] = proto
		p[7] = 64
		s, d := src.As16(), dst.As16()
		copy(p[8:], s[:])
		copy(p[24:], d[:])
		copy(p[40:], payload)
		return p, nil
	}
	return nil, fmt.Errorf("testbed: addresses %v and %v are not of one family", src, dst)
}

// BuildUDP returns a UDP header and payload from src:sport to dst:dport
// with a valid checksum, ready for BuildIP with protocol 17.
func BuildUDP(src, dst netip.Addr, sport, dport uint16, payload []byte) ([]byte, error) {
	if len(payload) > 65535-8 {
		return nil, errors.New("testbed: UDP payload too long")
	}
	u := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
	copy(u[8:], payload)
	var sum uint32
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		sum = sum32(sum, s[:])
		sum = sum32(sum, d[:])
	} else {
		s, d := src.As16(), dst.As16()
		sum = sum32(sum, s[:])
		sum = sum32(sum, d[:])
	}
	sum += 17 + uint32(len(u))
	c := ^fold(sum32(sum, u))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], c)
	return u, nil
}

// BuildESP returns an ESP header with spi and seq followed by body (which
// stands for IV, ciphertext and ICV).
func BuildESP(spi, seq uint32, body []byte) []byte {
	p := make([]byte, 8+len(body))
	binary.BigEndian.PutUint32(p, spi)
	binary.BigEndian.PutUint32(p[4:], seq)
	copy(p[8:], body)
	return p
}

// sum32 adds the 16-bit words of b to the one's complement sum.
func sum32(sum uint32, b []byte) uint32 {
	for len(b) >= 2 {
		sum += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	return sum
}

func fold(sum uint32) uint16 {
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum)
}
