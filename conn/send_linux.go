package conn

import (
	"errors"
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawSender sends Packets: ESP-in-UDP from the encapsulation port's UDP
// sockets with UDP_SEGMENT where it can (gsoConn), everything else
// (raw ESP, outer fragments, ESP-in-UDP the UDP socket cannot send as is)
// through IPPROTO_RAW sockets, which imply IP_HDRINCL (IPv4) and
// IPV6_HDRINCL (IPv6), with the outer header written into the packet's
// headroom (outer.go). Packets leave in the order given.
type rawSender struct {
	mu     sync.Mutex
	v4, v6 *mmsgConn
	g4, g6 *gsoConn // nil: no UDP socket of the family, or GSO off

	frags  [][]byte // fragment buffers, reused
	fragID uint32   // the last IPv6 fragment identification used

	// the Send call in progress
	n4, n6   int
	nfrag    int
	sent     int
	firstErr error
	fallback func(pkts []*Packet)
}

func openRawSender(cfg SocketConfig, counts *ioCounts) (*rawSender, error) {
	s := &rawSender{fragID: uint32(time.Now().UnixNano())}
	s.fallback = s.sendRaw
	fd, err := socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW, cfg, "raw send")
	if err != nil {
		return nil, err
	}
	if s.v4, err = newMmsgConn(fd, "esp-send-IPv4", cfg.Batch); err != nil {
		unix.Close(fd)
		return nil, err
	}
	s.v4.counts = counts
	if cfg.NoIPv6 {
		return s, nil
	}
	fd, err = socket(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_RAW, cfg, "raw send")
	if err != nil {
		s.Close()
		return nil, err
	}
	if s.v6, err = newMmsgConn(fd, "esp-send-IPv6", cfg.Batch); err != nil {
		unix.Close(fd)
		s.Close()
		return nil, err
	}
	s.v6.counts = counts
	return s, nil
}

// useGSO sends the ESP-in-UDP that allows it from u's socket (it owns the
// encapsulation port).
func (s *rawSender) useGSO(u *receiver, batch int) {
	g := newGSOConn(u.c.rc, u.fam, u.port, batch, u.c.counts)
	if u.fam == unix.AF_INET {
		s.g4 = g
	} else {
		s.g6 = g
	}
}

// Send implements Bind.Send.
func (s *rawSender) Send(pkts []Packet) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent, s.firstErr, s.nfrag = 0, nil, 0
	for i := range pkts {
		p := &pkts[i]
		g := s.g4
		if p.Dst.Is6() {
			g = s.g6
		}
		if g.eligible(p) {
			s.flushRaw()
			if !g.add(p) {
				s.flushGSO()
				g.add(p)
			}
			continue
		}
		s.flushGSO()
		s.queueRaw(p)
	}
	s.flushGSO()
	s.flushRaw()
	return s.sent, s.firstErr
}

func (s *rawSender) fail(err error) {
	if err != nil && s.firstErr == nil {
		s.firstErr = err
	}
}

// queueRaw writes p's outer header, fragments it if it must, and queues
// the result for the raw sockets, sending what is queued when a vector is
// full.
func (s *rawSender) queueRaw(p *Packet) {
	full, err := PutOuter(p)
	if err != nil {
		s.fail(err)
		return
	}
	if p.FragmentAbove <= 0 || len(full) <= p.FragmentAbove {
		s.queueIP(full, p.Dst)
		return
	}
	frags, err := s.fragment(full, p.FragmentAbove)
	if err != nil {
		s.fail(err)
		return
	}
	for _, f := range frags {
		s.queueIP(f, p.Dst)
	}
}

// queueIP queues the complete IP packet ip (or fragment of one) to dst,
// the packet's destination, IPv4 or IPv6 as PutOuter built its header.
func (s *rawSender) queueIP(ip []byte, dst netip.Addr) {
	if dst.Is4() {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&s.v4.names[s.n4]))
		*sa = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: dst.As4()}
		s.v4.prepare(s.n4, ip, false, unix.SizeofSockaddrInet4)
		if s.n4++; s.n4 == len(s.v4.hdrs) {
			s.flushRaw()
		}
		return
	}
	if s.v6 == nil {
		s.fail(ErrNoIPv6)
		return
	}
	s.v6.names[s.n6] = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: dst.As16()}
	s.v6.prepare(s.n6, ip, false, unix.SizeofSockaddrInet6)
	if s.n6++; s.n6 == len(s.v6.hdrs) {
		s.flushRaw()
	}
}

// fragment splits the complete outer packet ip into fragments of at most
// mtu bytes in the sender's fragment buffers; each buffer serves one
// fragment per Send call, so none is rewritten before the raw vectors
// that point at it are sent.
func (s *rawSender) fragment(ip []byte, mtu int) ([][]byte, error) {
	k, err := fragmentCount(len(ip), ip[0]>>4 == 6, mtu)
	if err != nil {
		return nil, err
	}
	for len(s.frags) < s.nfrag+k {
		s.frags = append(s.frags, nil)
	}
	frags := s.frags[s.nfrag : s.nfrag+k]
	for i := range frags {
		if cap(frags[i]) < mtu {
			frags[i] = make([]byte, mtu)
		}
		frags[i] = frags[i][:cap(frags[i])]
	}
	s.fragID++
	n, err := fragmentIP(frags, ip, mtu, s.fragID)
	if err != nil {
		return nil, err
	}
	s.nfrag += n
	return frags[:n], nil
}

// sendRaw sends pkts through the raw sockets at once (the GSO fallback).
func (s *rawSender) sendRaw(pkts []*Packet) {
	for _, p := range pkts {
		s.queueRaw(p)
	}
	s.flushRaw()
}

func (s *rawSender) flushRaw() {
	if s.n4 > 0 {
		ok, err := flush(s.v4, s.n4)
		s.sent += ok
		s.fail(err)
		s.n4 = 0
	}
	if s.n6 > 0 {
		ok, err := flush(s.v6, s.n6)
		s.sent += ok
		s.fail(err)
		s.n6 = 0
	}
}

func (s *rawSender) flushGSO() {
	for _, g := range [2]*gsoConn{s.g4, s.g6} {
		if g.pending() {
			s.sent += g.flush(s.fallback)
		}
	}
}

// flush sends the n prepared messages of c, skipping any that fails.
func flush(c *mmsgConn, n int) (int, error) {
	var firstErr error
	sent := 0
	for off := 0; off < n; {
		k, err := c.sendFrom(off, n-off)
		sent += k
		off += k
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			off++ // skip the message that failed
		}
	}
	return sent, firstErr
}

// Close closes the raw sockets (the UDP ones are the receivers').
func (s *rawSender) Close() error {
	var errs []error
	if s.v4 != nil {
		errs = append(errs, s.v4.close())
	}
	if s.v6 != nil {
		errs = append(errs, s.v6.close())
	}
	return errors.Join(errs...)
}
