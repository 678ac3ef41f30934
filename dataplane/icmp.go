package dataplane

import (
	"net/netip"
	"time"

	"github.com/espd/espd/packet"
	"github.com/espd/espd/tun"
)

// icmpSender writes rate-limited "fragmentation needed" and "packet too
// big" errors into the TUN. It belongs to the TUN reader.
type icmpSender struct {
	d      *Device
	tun    TUN // the interface the reader reads
	buf    []byte
	bufs   [][]byte
	rate   float64 // per second; <= 0: off
	tokens float64
	last   time.Time
}

func (s *icmpSender) init(d *Device, t TUN) {
	s.d, s.tun = d, t
	s.buf = make([]byte, tun.MinWriteOffset+minIPv6MTU+64)
	s.bufs = make([][]byte, 1)
	s.rate = float64(d.cfg.ICMPRate)
	s.tokens = s.rate
}

// tooBig answers the inner packet pkt, which does not fit, with an error
// announcing mtu. The error comes from pkt's destination: the kernel
// accepts it from there, and would drop one from its own address.
func (s *icmpSender) tooBig(pkt []byte, mtu int, l *local) {
	if s.rate <= 0 {
		return
	}
	now := time.Now()
	s.tokens = min(s.rate, s.tokens+now.Sub(s.last).Seconds()*s.rate)
	s.last = now
	if s.tokens < 1 {
		l[cICMPLimited]++
		return
	}
	var src netip.Addr
	if pkt[0]>>4 == 4 {
		src = netip.AddrFrom4([4]byte(pkt[16:20]))
	} else {
		src = netip.AddrFrom16([16]byte(pkt[24:40]))
	}
	n, err := packet.PacketTooBig(s.buf[tun.MinWriteOffset:], src, pkt, mtu)
	if err != nil {
		return // no error is due for this packet (RFC 1122, RFC 4443)
	}
	s.tokens--
	s.bufs[0] = s.buf[:tun.MinWriteOffset+n]
	if err := s.tun.Write(s.bufs, tun.MinWriteOffset); err != nil {
		l[cTUNWriteErrors]++
		s.d.logf(logTUNWrite, "TUN write of an ICMP error failed", "err", err)
		return
	}
	l[cICMPSent]++
	l[cTUNTxPackets]++
	l[cTUNTxBytes] += uint64(n)
}
