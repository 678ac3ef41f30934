package conn

import (
	"encoding/binary"
	"net/netip"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/packet"
)

// UDP segmentation offload for ESP-in-UDP (RFC 3948).
//
// Raw ESP costs the kernel a trip through its IP output path, the link and
// the peer's IP input path for every packet. ESP-in-UDP can do better:
// sent from the encapsulation port's UDP socket with UDP_SEGMENT, a run of
// same-size datagrams to one peer is one message that the kernel carries
// as a single GSO packet and splits only where it must (a real NIC
// segments it in hardware or at the driver; veth passes it whole), and a
// receiving socket with UDP_GRO gets such a run back as one datagram with
// its segment size. The ESP packets on the wire are the same; only the
// outer IPv4 ID (the kernel's, not Packet.ID) and the UDP checksum
// (computed, not zero) differ from what the raw sockets send.
const (
	// gsoMaxSegments is the most datagrams per UDP_SEGMENT message: the
	// kernel's UDP_MAX_SEGMENTS (64 before Linux 6.9, 128 since).
	gsoMaxSegments = 64
	// gsoMaxBytes bounds a message's UDP payload (the UDP length field).
	gsoMaxBytes = 65535 - packet.UDPHeaderLen - packet.IPv6HeaderLen
	// groBufSize holds the largest datagram UDP_GRO delivers.
	groBufSize = 1 << 16
	// groMessages is the number of datagrams per recvmmsg with UDP_GRO.
	groMessages = 16
	// gsoFailLimit is the number of consecutive failed UDP_SEGMENT
	// messages after which a family falls back to the raw sender for good
	// (a kernel without UDP_SEGMENT, a path that refuses it).
	gsoFailLimit = 8
)

// gsoSock is the encapsulation port's UDP socket as the senders share it,
// with what they learn about UDP_SEGMENT.
type gsoSock struct {
	rc     syscall.RawConn
	fam    int
	port   uint16
	counts *ioCounts

	fails atomic.Int32 // consecutive failed messages
	off   atomic.Bool  // given up on UDP_SEGMENT: everything goes raw
}

// gsoConn sends UDP-encapsulated ESP from the encapsulation port's socket,
// grouping consecutive datagrams of one size to one peer, with the same
// source, TOS and TTL, into UDP_SEGMENT messages. It is one Send call's
// scratch (sendScratch); the socket is shared.
type gsoConn struct {
	*gsoSock

	hdrs  []mmsghdr
	iovs  []unix.Iovec // one per datagram
	names []unix.RawSockaddrInet6
	oob   []byte    // gsoOOB bytes per message
	pkts  []*Packet // the caller's, valid during its Send
	first []int     // per message: index of its first datagram in pkts and iovs
	segs  []int     // per message: its segment size

	nmsg   int
	closed bool // the last message takes no more datagrams

	// the sendmmsg call in progress, read by writeFn and tryFn
	callOff, callN int
	count          int
	errno          syscall.Errno
	tried          bool // tryFn had an answer other than EAGAIN
	writeFn        func(uintptr) bool
	tryFn          func(uintptr)
}

// gsoOOB is the control-message room per message: source address, TOS or
// traffic class, TTL or hop limit, segment size.
const gsoOOB = 128

func newGSOConn(sock *gsoSock, batch int) *gsoConn {
	g := &gsoConn{
		gsoSock: sock,
		hdrs:    make([]mmsghdr, batch),
		iovs:    make([]unix.Iovec, 2*batch),
		names:   make([]unix.RawSockaddrInet6, batch),
		oob:     make([]byte, batch*gsoOOB),
		pkts:    make([]*Packet, 2*batch),
		first:   make([]int, batch),
		segs:    make([]int, batch),
	}
	g.writeFn = g.sendmmsg
	g.tryFn = func(fd uintptr) { g.tried = g.sendmmsg(fd) }
	return g
}

// send runs sendmmsg on messages callOff to callOff+callN, directly and,
// if the socket's buffer is full, waiting in the poller (sendVec.sendFrom).
func (g *gsoConn) send() error {
	g.tried = false
	if err := g.rc.Control(g.tryFn); err != nil || g.tried {
		return err
	}
	return g.rc.Write(g.writeFn)
}

func (g *gsoConn) sendmmsg(fd uintptr) bool {
	// Raw: the socket is non-blocking (a blocking call would hold its thread; the poller waits instead).
	r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&g.hdrs[g.callOff])), uintptr(g.callN), unix.MSG_DONTWAIT, 0, 0)
	if e == unix.EAGAIN || e == unix.EINTR {
		return false
	}
	g.count, g.errno = int(r), e
	return true
}

// eligible reports whether p is ESP-in-UDP that the socket can send as
// it is: from the encapsulation port, to the socket's family, over IPv4
// with DF set (what the socket sets on a datagram that fits the path),
// and whole (no outer fragmentation asked for).
func (g *gsoConn) eligible(p *Packet) bool {
	if g == nil || g.off.Load() || p.DstPort == 0 || p.SrcPort != g.port || p.End-p.Start > gsoMaxBytes {
		return false
	}
	if g.fam == unix.AF_INET {
		if !p.Dst.Is4() || !p.Src.Is4() || !p.DF {
			return false
		}
	} else if !p.Dst.Is6() || p.Dst.Is4In6() || !p.Src.Is6() {
		return false
	}
	return p.FragmentAbove <= 0 || OuterLen(&p.Endpoint)+p.End-p.Start <= p.FragmentAbove
}

// sameGroup reports whether p goes to the same peer with the same outer
// header fields as q, the first datagram of a message.
func sameGroup(p, q *Packet) bool {
	return p.TOS == q.TOS && p.TTL == q.TTL && p.Src == q.Src && p.Dst == q.Dst && p.DstPort == q.DstPort
}

// add queues p (eligible). It reports false, queueing nothing, when the
// vectors are full: flush and add again.
func (g *gsoConn) add(p *Packet) bool {
	n := g.used()
	if n == len(g.iovs) {
		return false
	}
	payload := p.Buf[p.Start:p.End]
	if m := g.nmsg - 1; m >= 0 && !g.closed {
		h := &g.hdrs[m].hdr
		seg, cnt := g.segs[m], int(h.Iovlen)
		if len(payload) <= seg && cnt < gsoMaxSegments && (cnt+1)*seg <= gsoMaxBytes && sameGroup(p, g.pkts[g.first[m]]) {
			g.setIov(n, p, payload)
			h.SetIovlen(cnt + 1)
			g.closed = len(payload) < seg
			return true
		}
	}
	if g.nmsg == len(g.hdrs) {
		return false
	}
	m := g.nmsg
	g.nmsg++
	g.first[m], g.segs[m] = n, len(payload)
	g.closed = false
	g.setIov(n, p, payload)
	h := &g.hdrs[m].hdr
	*h = unix.Msghdr{}
	h.Iov = &g.iovs[n]
	h.SetIovlen(1)
	h.Name = (*byte)(unsafe.Pointer(&g.names[m]))
	if g.fam == unix.AF_INET {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&g.names[m]))
		*sa = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: p.Dst.As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], p.DstPort)
		h.Namelen = unix.SizeofSockaddrInet4
	} else {
		sa := &g.names[m]
		*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: p.Dst.As16()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], p.DstPort)
		h.Namelen = unix.SizeofSockaddrInet6
	}
	g.hdrs[m].len = 0
	return true
}

func (g *gsoConn) setIov(i int, p *Packet, payload []byte) {
	g.pkts[i] = p
	iov := &g.iovs[i]
	iov.Base = unsafe.SliceData(payload)
	iov.SetLen(len(payload))
}

// finish writes message m's control messages: the source address, the
// TOS or traffic class and the TTL or hop limit of its first datagram's
// header, and the segment size if it has more than one datagram.
func (g *gsoConn) finish(m int) {
	p := g.pkts[g.first[m]]
	oob := g.oob[m*gsoOOB : (m+1)*gsoOOB]
	off := 0
	put := func(level, typ int32, data []byte) {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[off]))
		h.Level, h.Type = level, typ
		h.SetLen(unix.CmsgLen(len(data)))
		copy(oob[off+unix.CmsgLen(0):], data)
		off += unix.CmsgSpace(len(data))
	}
	var b [20]byte
	if g.fam == unix.AF_INET {
		// struct in_pktinfo: ifindex, spec_dst (the source), addr
		clear(b[:12])
		a := p.Src.As4()
		copy(b[4:8], a[:])
		put(unix.IPPROTO_IP, unix.IP_PKTINFO, b[:unix.SizeofInet4Pktinfo])
		binary.NativeEndian.PutUint32(b[:4], uint32(p.TOS))
		put(unix.IPPROTO_IP, unix.IP_TOS, b[:4])
		binary.NativeEndian.PutUint32(b[:4], uint32(p.TTL))
		put(unix.IPPROTO_IP, unix.IP_TTL, b[:4])
	} else {
		// struct in6_pktinfo: addr, ifindex
		a := p.Src.As16()
		copy(b[:16], a[:])
		clear(b[16:20])
		put(unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, b[:unix.SizeofInet6Pktinfo])
		binary.NativeEndian.PutUint32(b[:4], uint32(p.TOS))
		put(unix.IPPROTO_IPV6, unix.IPV6_TCLASS, b[:4])
		binary.NativeEndian.PutUint32(b[:4], uint32(p.TTL))
		put(unix.IPPROTO_IPV6, unix.IPV6_HOPLIMIT, b[:4])
	}
	if g.hdrs[m].hdr.Iovlen > 1 {
		binary.NativeEndian.PutUint16(b[:2], uint16(g.segs[m]))
		put(unix.SOL_UDP, unix.UDP_SEGMENT, b[:2])
	}
	h := &g.hdrs[m].hdr
	h.Control = &oob[0]
	h.SetControllen(off)
}

// pending reports whether messages wait to be sent.
func (g *gsoConn) pending() bool { return g != nil && g.nmsg > 0 }

// flush sends the queued messages. A message of one datagram gains
// nothing from the UDP socket and goes to fallback (the raw sender) with
// the rest of its run of such messages: its UDP checksum is then the one
// PutOuter writes, complete, whereas the socket leaves it to checksum
// offload, which a virtual link (veth) never performs, so that a capture
// there shows it incomplete and cannot be replayed (the end-to-end
// injection test does exactly that with pings). A message the kernel
// refuses goes to fallback datagram by datagram, so that nothing is lost to
// a kernel or path without UDP_SEGMENT; after gsoFailLimit refusals in a
// row the family stops trying. It returns the datagrams sent here.
func (g *gsoConn) flush(fallback func(pkts []*Packet)) (sent int) {
	for off := 0; off < g.nmsg; {
		end := off
		for end < g.nmsg && g.hdrs[end].hdr.Iovlen == 1 {
			end++
		}
		if end > off {
			fallback(g.pkts[g.first[off] : g.first[end-1]+1])
			off = end
			continue
		}
		for end < g.nmsg && g.hdrs[end].hdr.Iovlen > 1 {
			g.finish(end)
			end++
		}
		for off < end {
			g.callOff, g.callN = off, end-off
			err := g.send()
			k := 0
			if err == nil && g.errno == 0 {
				k = g.count
				g.counts.send(k)
			}
			for m := off; m < off+k; m++ {
				sent += int(g.hdrs[m].hdr.Iovlen)
			}
			if k > 0 && g.fails.Load() != 0 {
				g.fails.Store(0)
			}
			off += k
			if off < end && (err != nil || g.errno != 0 || k == 0) {
				// message off failed: send its datagrams the raw way
				f := g.first[off]
				fallback(g.pkts[f : f+int(g.hdrs[off].hdr.Iovlen)])
				if g.fails.Add(1) >= gsoFailLimit {
					g.off.Store(true)
				}
				off++
			}
		}
	}
	clear(g.pkts[:g.used()])
	g.nmsg, g.closed = 0, false
	return sent
}

// used returns the number of datagrams queued.
func (g *gsoConn) used() int {
	if g.nmsg == 0 {
		return 0
	}
	return g.first[g.nmsg-1] + int(g.hdrs[g.nmsg-1].hdr.Iovlen)
}

// groReader splits the datagrams a UDP_GRO socket delivers, each a run of
// segments of one size, into the caller's messages, one ESP packet each,
// keeping what does not fit for the next call.
type groReader struct {
	bufs  [][]byte
	metas []groMeta
	n     int // datagrams from the last recvmmsg
	next  int // next datagram to split
	off   int // offset of its next segment

	datagrams uint64 // received, for tests
}

type groMeta struct {
	src, dst netip.AddrPort
	tos      uint8
	seg      int // segment size; 0: one datagram
	size     int
	err      error
}

func newGROReader() *groReader {
	g := &groReader{bufs: make([][]byte, groMessages), metas: make([]groMeta, groMessages)}
	for i := range g.bufs {
		g.bufs[i] = make([]byte, groBufSize)
	}
	return g
}

// receiveGRO implements Receive for a UDP socket with UDP_GRO.
func (r *receiver) receiveGRO(msgs []Message) (int, error) {
	g := r.gro
	if g.next >= g.n {
		n := min(len(g.bufs), len(r.c.hdrs))
		for i := range n {
			r.c.prepare(i, g.bufs[i], true, 0)
		}
		n, err := r.c.recv(n)
		if err != nil {
			return 0, err
		}
		for i := range n {
			r.parseGRO(i, &g.metas[i])
		}
		g.n, g.next, g.off = n, 0, 0
		g.datagrams += uint64(n)
	}
	k := 0
	for k < len(msgs) && g.next < g.n {
		mt := &g.metas[g.next]
		m := &msgs[k]
		// Field by field: a composite literal would copy the whole
		// struct with its pointers (write barriers) for every packet.
		m.Start, m.End, m.UDP, m.TOS = 0, 0, true, mt.tos
		m.Src, m.Dst, m.Err = mt.src, mt.dst, mt.err
		l := mt.size - g.off
		if mt.seg > 0 && l > mt.seg {
			l = mt.seg
		}
		if mt.err == nil {
			if RecvOffset+l > len(m.Buf) {
				m.Err = ErrTruncated
			} else {
				copy(m.Buf[RecvOffset:], g.bufs[g.next][g.off:g.off+l])
				m.Start, m.End = RecvOffset, RecvOffset+l
			}
		}
		if g.off += l; g.off >= mt.size || mt.err != nil {
			g.next++
			g.off = 0
		}
		k++
	}
	return k, nil
}

// parseGRO fills in mt from datagram i of the last recvmmsg.
func (r *receiver) parseGRO(i int, mt *groMeta) {
	h := &r.c.hdrs[i]
	*mt = groMeta{}
	src, sport := r.peer(i)
	var dst netip.Addr
	mt.seg = parseControl(r.c.control(i), &dst, &mt.tos)
	mt.src = netip.AddrPortFrom(src, sport)
	mt.dst = netip.AddrPortFrom(dst, r.port)
	if h.hdr.Flags&unix.MSG_TRUNC != 0 {
		mt.err = ErrTruncated
		return
	}
	mt.size = int(h.len)
}
