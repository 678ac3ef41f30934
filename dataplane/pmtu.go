package dataplane

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"time"

	"github.com/espd/espd/packet"
	"github.com/espd/espd/tun"
)

// pmtuRefresh is how long a path MTU learnt from the routing table is
// used before it is looked up again.
const pmtuRefresh = 30 * time.Second

// pmtuCache is the TUN reader's memory of the path MTU to each peer.
type pmtuCache struct {
	fixed  int
	router Router
	m      map[netip.Addr]int
	reset  time.Time
}

func (c *pmtuCache) init(d *Device) {
	c.fixed, c.router = d.cfg.OuterMTU, d.io.Router
	c.m = make(map[netip.Addr]int)
	if c.fixed == 0 && c.router == nil {
		c.fixed = DefaultOuterMTU
	}
}

// get returns the outer MTU towards dst.
func (c *pmtuCache) get(dst netip.Addr) int {
	if c.fixed > 0 {
		return c.fixed
	}
	if now := time.Now(); now.Sub(c.reset) > pmtuRefresh {
		clear(c.m)
		c.reset = now
	}
	if mtu, ok := c.m[dst]; ok {
		return mtu
	}
	mtu, err := c.router.PathMTU(dst)
	if err != nil || mtu < 576 {
		mtu = DefaultOuterMTU
	}
	c.m[dst] = mtu
	return mtu
}

// icmpSender writes rate-limited "fragmentation needed" and "packet too
// big" errors into the TUN. It belongs to the TUN reader.
type icmpSender struct {
	d      *Device
	buf    []byte
	bufs   [][]byte
	rate   float64 // per second; <= 0: off
	tokens float64
	last   time.Time
}

func (s *icmpSender) init(d *Device) {
	s.d = d
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
	if err := s.d.io.TUN.Write(s.bufs, tun.MinWriteOffset); err != nil {
		l[cTUNWriteErrors]++
		s.d.logf(logTUNWrite, "TUN write of an ICMP error failed", "err", err)
		return
	}
	l[cICMPSent]++
	l[cTUNTxPackets]++
	l[cTUNTxBytes] += uint64(n)
}

// clearDF clears the DF bit of an IPv4 packet, updating its checksum; it
// leaves IPv6 packets alone.
func clearDF(pkt []byte) {
	if pkt[0]>>4 != 4 {
		return
	}
	old := binary.BigEndian.Uint16(pkt[6:8])
	if old&packet.IPv4DontFragment == 0 {
		return
	}
	v := old &^ packet.IPv4DontFragment
	binary.BigEndian.PutUint16(pkt[6:8], v)
	binary.BigEndian.PutUint16(pkt[10:12], packet.UpdateChecksum16(binary.BigEndian.Uint16(pkt[10:12]), old, v))
}

var errFragMTU = errors.New("dataplane: MTU too small to fragment")

// fragment splits the outer packet pkt into fragments of at most mtu
// bytes, in the sender's fragment buffers, appends them to s.pkts and
// returns how many there are.
func (d *Device) fragment(s *outSender, pkt []byte, mtu int) (int, error) {
	hl, per := packet.IPv4HeaderLen, 0
	if pkt[0]>>4 == 6 {
		hl = packet.IPv6HeaderLen + 8
	} else {
		hl = int(pkt[0]&0x0f) * 4
	}
	per = (mtu - hl) &^ 7
	if per < 8 {
		return 0, errFragMTU
	}
	k := (len(pkt) - hl + per - 1) / per
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
	var n int
	var err error
	if pkt[0]>>4 == 6 {
		n, err = fragmentIPv6(frags, pkt, mtu, d.fragID.Add(1))
	} else {
		n, err = packet.FragmentIPv4(frags, pkt, mtu)
	}
	if err != nil {
		return 0, err
	}
	s.pkts = append(s.pkts, frags[:n]...)
	s.nfrag += n
	return n, nil
}

// fragmentIPv6 splits the IPv6 packet pkt, which has no extension headers
// (espd built it), into fragments of at most mtu bytes with Fragment
// headers of identification id (RFC 8200 section 4.5), written into
// frags. It returns the number of fragments.
func fragmentIPv6(frags [][]byte, pkt []byte, mtu int, id uint32) (int, error) {
	const fh = 8
	if len(pkt) < packet.IPv6HeaderLen || pkt[0]>>4 != 6 {
		return 0, packet.ErrTruncated
	}
	per := (mtu - packet.IPv6HeaderLen - fh) &^ 7
	if per < 8 {
		return 0, errFragMTU
	}
	payload := pkt[packet.IPv6HeaderLen:]
	k := (len(payload) + per - 1) / per
	if k > len(frags) {
		return 0, packet.ErrShortBuffer
	}
	for i := range k {
		off := i * per
		chunk := payload[off:min(off+per, len(payload))]
		if cap(frags[i]) < packet.IPv6HeaderLen+fh+len(chunk) {
			return 0, packet.ErrShortBuffer
		}
	}
	for i := range k {
		off := i * per
		chunk := payload[off:min(off+per, len(payload))]
		f := frags[i][:packet.IPv6HeaderLen+fh+len(chunk)]
		copy(f, pkt[:packet.IPv6HeaderLen])
		binary.BigEndian.PutUint16(f[4:6], uint16(fh+len(chunk)))
		f[6] = packet.ProtoFragment
		f[40] = pkt[6]
		f[41] = 0
		fo := uint16(off) // offset in 8-byte units << 3 equals the byte offset
		if i < k-1 {
			fo |= 1 // M flag
		}
		binary.BigEndian.PutUint16(f[42:44], fo)
		binary.BigEndian.PutUint32(f[44:48], id)
		copy(f[48:], chunk)
		frags[i] = f
	}
	return k, nil
}
