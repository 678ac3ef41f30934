package afxdp

import (
	"encoding/binary"
	"net/netip"
	"sync/atomic"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/packet"
)

// receiver reads one queue's AF_XDP socket as a conn.Receiver.
type receiver struct {
	s         *socket
	encapPort uint16
	counts    *counts

	msgs []conn.Message // of the Receive in progress, read by readFn
	n    int
	// readFn is the poller callback, bound once so that Receive
	// allocates nothing.
	readFn func(uintptr) bool
}

func newReceiver(s *socket, encapPort uint16, c *counts) *receiver {
	r := &receiver{s: s, encapPort: encapPort, counts: c}
	r.readFn = r.read
	return r
}

// Receive implements conn.Receiver: it blocks until the RX ring holds a
// frame and copies up to len(msgs) frames' ESP packets (or UDP payloads)
// to msgs[i].Buf[conn.RecvOffset:], returning each frame to the fill
// ring.
func (r *receiver) Receive(msgs []conn.Message) (int, error) {
	r.msgs, r.n = msgs, 0
	err := r.s.rc.Read(r.readFn)
	n := r.n
	r.msgs = nil
	if err != nil {
		return 0, err
	}
	return n, nil
}

// read drains the RX ring into r.msgs; false (nothing there) makes the
// poller wait for the socket to become readable.
func (r *receiver) read(uintptr) bool {
	s := r.s
	cons := *s.rx.cons
	prod := atomic.LoadUint32(s.rx.prod)
	avail := prod - cons
	if avail == 0 {
		return false
	}
	n := min(int(avail), len(r.msgs))
	fill := *s.fill.prod
	for i := range n {
		d := s.rx.rxDesc(cons + uint32(i))
		frame := s.umem[d.Addr : d.Addr+uint64(d.Len)]
		parseFrame(frame, &r.msgs[i], r.encapPort)
		*s.fill.fillAddr(fill + uint32(i)) = d.Addr &^ (frameSize - 1)
	}
	atomic.StoreUint32(s.fill.prod, fill+uint32(n))
	atomic.StoreUint32(s.rx.cons, cons+uint32(n))
	r.n = n
	r.counts.frames.Add(uint64(n))
	r.counts.reads.Add(1)
	return true
}

// Close implements conn.Receiver.
func (r *receiver) Close() error { return r.s.close() }

// parseFrame fills m from an Ethernet frame that the XDP program handed
// over: it checks the outer header as the kernel's receive path would
// (the IPv4 checksum, the lengths), copies the ESP packet or UDP payload
// to m.Buf[conn.RecvOffset:], and sets m.Err if the frame is unusable.
func parseFrame(f []byte, m *conn.Message, encapPort uint16) {
	*m = conn.Message{Buf: m.Buf}
	if len(f) < ethLen+1 {
		m.Err = conn.ErrOuterHeader
		return
	}
	ip := f[ethLen:]
	var l4 []byte
	var proto uint8
	switch ip[0] >> 4 {
	case 4:
		h, err := packet.ParseIPv4Header(ip)
		if err != nil || h.MF || h.FragOffset != 0 {
			m.Err = conn.ErrOuterHeader
			return
		}
		m.Src, m.Dst = netip.AddrPortFrom(h.Src, 0), netip.AddrPortFrom(h.Dst, 0)
		m.TOS, proto = h.TOS, h.Protocol
		l4 = ip[h.HeaderLen:h.TotalLen]
	case 6:
		if len(ip) < packet.IPv6HeaderLen {
			m.Err = conn.ErrOuterHeader
			return
		}
		end := packet.IPv6HeaderLen + int(binary.BigEndian.Uint16(ip[4:6]))
		if end > len(ip) {
			m.Err = conn.ErrOuterHeader
			return
		}
		m.Src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[8:24])), 0)
		m.Dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[24:40])), 0)
		m.TOS = ip[0]<<4 | ip[1]>>4
		proto = ip[6]
		l4 = ip[packet.IPv6HeaderLen:end]
	default:
		m.Err = conn.ErrOuterHeader
		return
	}
	switch {
	case proto == packet.ProtoESP:
	case proto == packet.ProtoUDP && encapPort != 0:
		if len(l4) < packet.UDPHeaderLen {
			m.Err = conn.ErrOuterHeader
			return
		}
		ulen := int(binary.BigEndian.Uint16(l4[4:6]))
		if ulen < packet.UDPHeaderLen || ulen > len(l4) || binary.BigEndian.Uint16(l4[2:4]) != encapPort {
			m.Err = conn.ErrOuterHeader
			return
		}
		m.UDP = true
		m.Src = netip.AddrPortFrom(m.Src.Addr(), binary.BigEndian.Uint16(l4[0:2]))
		m.Dst = netip.AddrPortFrom(m.Dst.Addr(), encapPort)
		l4 = l4[packet.UDPHeaderLen:ulen]
	default:
		m.Err = conn.ErrNotESP
		return
	}
	if len(l4) > len(m.Buf)-conn.RecvOffset {
		m.Err = conn.ErrTruncated
		return
	}
	m.Start = conn.RecvOffset
	m.End = conn.RecvOffset + copy(m.Buf[conn.RecvOffset:], l4)
}
