package conn

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawSender sends Packets: ESP-in-UDP from the encapsulation port's UDP
// sockets with UDP_SEGMENT where it can (gsoConn), everything else
// (raw ESP, outer fragments, ESP-in-UDP the UDP socket cannot send as is)
// through IPPROTO_RAW sockets, which imply IP_HDRINCL (IPv4) and
// IPV6_HDRINCL (IPv6), with the outer header written into the packet's
// headroom (outer.go). Packets of one Send leave in the order given.
//
// Send may be called from several goroutines at once (the shards'
// in-order stages) and none waits for another: only the sockets are
// shared. Each call takes its own scratch (message vectors, GSO groups,
// fragment buffers) from a pool, as wireguard-go's StdNetBind does, and
// runs sendmmsg on the shared descriptor directly (sendScratch.sendFrom);
// only a call that finds a socket's buffer full waits, in the runtime
// poller, and only behind others that found the same socket full.
type rawSender struct {
	v4, v6 *mmsgConn // the raw sockets; their vectors are the scratches'
	g4, g6 *gsoSock  // nil: no UDP socket of the family, or GSO off
	batch  int

	fragID  atomic.Uint32 // the last IPv6 fragment identification used
	scratch sync.Pool     // of *sendScratch
}

// sendScratch is the state of one Send call.
type sendScratch struct {
	s      *rawSender
	v4, v6 *sendVec
	g4, g6 *gsoConn

	frags [][]byte // fragment buffers, reused

	n4, n6   int
	nfrag    int
	sent     int
	firstErr error
	fallback func(pkts []*Packet)
}

// sendVec is a scratch's message vectors for one raw socket.
type sendVec struct {
	*mmsgConn // vectors and call state; file and rc are the socket's
	tryFn     func(uintptr)
	tried     bool // tryFn ran sendmmsg to an answer other than EAGAIN
}

func newSendVec(base *mmsgConn, batch int) *sendVec {
	c := &mmsgConn{
		file: base.file, rc: base.rc, counts: base.counts,
		hdrs:  make([]mmsghdr, batch),
		iovs:  make([]unix.Iovec, batch),
		names: make([]unix.RawSockaddrInet6, batch),
	}
	c.writeFn = c.sendmmsg
	v := &sendVec{mmsgConn: c}
	v.tryFn = func(fd uintptr) { v.tried = c.sendmmsg(fd) }
	return v
}

// sendFrom runs sendmmsg on the n prepared headers from off on. It calls
// the socket directly, outside the descriptor's write lock (which the
// runtime holds while a writer waits in the poller); only when the buffer
// is full does it wait in the poller. It returns how many were sent; an
// error concerns the first message not sent.
func (v *sendVec) sendFrom(off, n int) (int, error) {
	v.off, v.n, v.flags, v.tried = off, n, unix.MSG_DONTWAIT, false
	if err := v.rc.Control(v.tryFn); err != nil {
		return 0, err
	}
	if !v.tried {
		return v.mmsgConn.sendFrom(off, n)
	}
	if v.errno != 0 {
		return 0, v.errno
	}
	v.counts.send(v.count)
	return v.count, nil
}

func openRawSender(cfg SocketConfig, counts *ioCounts) (*rawSender, error) {
	s := &rawSender{batch: cfg.Batch}
	s.fragID.Store(uint32(time.Now().UnixNano()))
	s.scratch.New = s.newScratch
	fd, err := socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW, cfg, "raw send")
	if err != nil {
		return nil, err
	}
	if s.v4, err = newMmsgConn(fd, "esp-send-IPv4", 0); err != nil {
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
	if s.v6, err = newMmsgConn(fd, "esp-send-IPv6", 0); err != nil {
		unix.Close(fd)
		s.Close()
		return nil, err
	}
	s.v6.counts = counts
	return s, nil
}

func (s *rawSender) newScratch() any {
	x := &sendScratch{s: s, v4: newSendVec(s.v4, s.batch)}
	if s.v6 != nil {
		x.v6 = newSendVec(s.v6, s.batch)
	}
	if s.g4 != nil {
		x.g4 = newGSOConn(s.g4, s.batch)
	}
	if s.g6 != nil {
		x.g6 = newGSOConn(s.g6, s.batch)
	}
	x.fallback = x.sendRaw
	return x
}

// useGSO sends the ESP-in-UDP that allows it from u's socket (it owns the
// encapsulation port). Before the first Send; the scratches' vectors take
// the sender's batch size.
func (s *rawSender) useGSO(u *receiver, _ int) {
	g := &gsoSock{rc: u.c.rc, fam: u.fam, port: u.port, counts: u.c.counts}
	if u.fam == unix.AF_INET {
		s.g4 = g
	} else {
		s.g6 = g
	}
}

// Send implements Bind.Send.
func (s *rawSender) Send(pkts []Packet) (int, error) {
	x := s.scratch.Get().(*sendScratch)
	n, err := x.send(pkts)
	s.scratch.Put(x)
	return n, err
}

func (s *sendScratch) send(pkts []Packet) (int, error) {
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
	err := s.firstErr
	s.firstErr = nil
	return s.sent, err
}

func (s *sendScratch) fail(err error) {
	if err != nil && s.firstErr == nil {
		s.firstErr = err
	}
}

// queueRaw writes p's outer header, fragments it if it must, and queues
// the result for the raw sockets, sending what is queued when a vector is
// full.
func (s *sendScratch) queueRaw(p *Packet) {
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
func (s *sendScratch) queueIP(ip []byte, dst netip.Addr) {
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
func (s *sendScratch) fragment(ip []byte, mtu int) ([][]byte, error) {
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
	n, err := fragmentIP(frags, ip, mtu, s.s.fragID.Add(1))
	if err != nil {
		return nil, err
	}
	s.nfrag += n
	return frags[:n], nil
}

// sendRaw sends pkts through the raw sockets at once (the GSO fallback).
func (s *sendScratch) sendRaw(pkts []*Packet) {
	for _, p := range pkts {
		s.queueRaw(p)
	}
	s.flushRaw()
}

func (s *sendScratch) flushRaw() {
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

func (s *sendScratch) flushGSO() {
	for _, g := range [2]*gsoConn{s.g4, s.g6} {
		if g.pending() {
			s.sent += g.flush(s.fallback)
		}
	}
}

// flush sends the n prepared messages of c, skipping any that fails.
func flush(c *sendVec, n int) (int, error) {
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
