package tun

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/packet"
)

// Write coalesces: consecutive TCP segments of a flow (and, with USO,
// same-size UDP datagrams of a flow) become one super-packet, as the
// kernel's GRO would build it, written with one writev whose vectors point
// at the first packet (virtio header and headers included) and at the
// payloads of the others, where they are: nothing is copied, and a
// super-packet may grow to 64 KiB whatever the size of the callers'
// buffers. Only packets whose checksum is valid are coalesced (a bad one
// is written alone, for the stack to drop), so that coalescing never
// hides a corrupted segment behind a checksum the kernel computes anew.

// maxSuper bounds a super-packet's IP length.
const maxSuper = 65535

// groupsMax is the number of flows a Write tracks at once; a packet of
// another flow closes the oldest group.
const groupsMax = 8

// group is one super-packet being built.
type group struct {
	first   int // index in bufs of the first packet
	last    int // index in bufs of the last packet added
	count   int
	hl      int    // IP + transport header length
	seg     int    // payload length of the first (the GSO size)
	payload int    // total payload length
	nextSeq uint32 // TCP: sequence number the next segment must have
	tcp     bool
	closed  bool // a shorter segment or PSH ended it
	psh     bool
}

// coalescer is a Write's plan, part of its writer's scratch (write.go).
type coalescer struct {
	udp    bool    // the device has USO: UDP may be coalesced
	groups []group // open and closed, in order of their first packet
	open   [groupsMax]int
	nopen  int
	member []int // for each packet: its group, or -1 (written alone)
	next   []int // for each packet: the next packet of its group, or -1
}

// candidate classifies pkt: it returns the header length and whether the
// packet may be coalesced (IPv4 without options and not fragmented, or
// IPv6 without extension headers; TCP with ACK and at most PSH besides,
// or UDP with USO; some payload; a valid checksum).
func (c *coalescer) candidate(pkt []byte) (hl int, tcp, ok bool) {
	var ipl int
	var proto uint8
	switch {
	case len(pkt) >= ipv4HeaderLen && pkt[0] == 0x45:
		if binary.BigEndian.Uint16(pkt[2:]) != uint16(len(pkt)) || binary.BigEndian.Uint16(pkt[6:])&0x3fff != 0 {
			return 0, false, false
		}
		ipl, proto = ipv4HeaderLen, pkt[9]
	case len(pkt) >= ipv6HeaderLen && pkt[0]>>4 == 6:
		if int(binary.BigEndian.Uint16(pkt[4:]))+ipv6HeaderLen != len(pkt) {
			return 0, false, false
		}
		ipl, proto = ipv6HeaderLen, pkt[6]
	default:
		return 0, false, false
	}
	t := pkt[ipl:]
	switch {
	case proto == unix.IPPROTO_TCP && len(t) >= 20:
		thl := int(t[tcpDataOff]>>4) * 4
		if thl < 20 || thl >= len(t) || t[tcpFlags]&^tcpFlagPSH != tcpFlagACK {
			return 0, false, false
		}
		hl, tcp = ipl+thl, true
	case proto == unix.IPPROTO_UDP && c.udp && len(t) > 8:
		if binary.BigEndian.Uint16(t[udpLen:]) != uint16(len(t)) || binary.BigEndian.Uint16(t[udpCsum:]) == 0 {
			return 0, false, false
		}
		hl = ipl + 8
	default:
		return 0, false, false
	}
	addrs := pkt[12:20]
	if ipl == ipv6HeaderLen {
		addrs = pkt[8:40]
	}
	if packet.Checksum(t, pseudoHeaderSum(addrs, proto, len(t))) != 0 {
		return 0, false, false
	}
	return hl, tcp, true
}

// sameFlow reports whether p may follow q in one super-packet as far as
// their headers go: same IP header but for length, ID and checksum, same
// transport header but for sequence number, PSH, length and checksum.
func sameFlow(p, q []byte, hl int, tcp bool) bool {
	if p[0] == 0x45 {
		// version, TOS; flags; TTL, protocol; addresses
		if p[1] != q[1] || p[6] != q[6] || p[8] != q[8] || p[9] != q[9] || string(p[12:20]) != string(q[12:20]) {
			return false
		}
		p, q = p[ipv4HeaderLen:hl], q[ipv4HeaderLen:hl]
	} else {
		// version, traffic class, flow label; next header, hop limit; addresses
		if string(p[0:4]) != string(q[0:4]) || string(p[6:40]) != string(q[6:40]) {
			return false
		}
		p, q = p[ipv6HeaderLen:hl], q[ipv6HeaderLen:hl]
	}
	if !tcp {
		return string(p[0:4]) == string(q[0:4]) // ports
	}
	// ports; ack, data offset; window; urgent pointer and options
	return string(p[0:4]) == string(q[0:4]) && string(p[tcpAck:tcpFlags]) == string(q[tcpAck:tcpFlags]) &&
		string(p[tcpWindow:tcpCsum]) == string(q[tcpWindow:tcpCsum]) && string(p[18:]) == string(q[18:])
}

// plan groups the packets bufs[i][offset:]. A packet joins the newest
// group of its flow when it continues it (next sequence number, same size
// or shorter, room left); otherwise it starts a group of its own, which
// keeps each flow's packets in order.
func (c *coalescer) plan(bufs [][]byte, offset int) {
	c.groups = c.groups[:0]
	c.nopen = 0
	if cap(c.member) < len(bufs) {
		c.member = make([]int, len(bufs))
		c.next = make([]int, len(bufs))
	}
	c.member, c.next = c.member[:len(bufs)], c.next[:len(bufs)]
	for i := range bufs {
		c.next[i] = -1
		pkt := bufs[i][offset:]
		hl, tcp, ok := c.candidate(pkt)
		if !ok {
			// Written alone, at its place: no later packet of its
			// addresses may join a group written before it.
			c.member[i] = -1
			c.closeAddrs(bufs, offset, pkt)
			continue
		}
		pl := len(pkt) - hl
		joined := false
		for k := c.nopen - 1; k >= 0; k-- {
			g := &c.groups[c.open[k]]
			q := bufs[g.first][offset:]
			if g.tcp != tcp || g.hl != hl || !sameFlow(pkt, q, hl, tcp) {
				continue
			}
			// the flow's newest group: join it or replace it
			if !g.closed && pl <= g.seg && hl+g.payload+pl <= maxSuper &&
				(!tcp || binary.BigEndian.Uint32(pkt[ipHeaderLen(pkt)+tcpSeq:]) == g.nextSeq) {
				c.next[g.last] = i
				g.last = i
				g.count++
				g.payload += pl
				g.nextSeq += uint32(pl)
				if pl < g.seg {
					g.closed = true
				}
				if tcp && pkt[ipHeaderLen(pkt)+tcpFlags]&tcpFlagPSH != 0 {
					g.closed, g.psh = true, true
				}
				c.member[i] = c.open[k]
				joined = true
			} else {
				// close it: this packet starts the flow's next group
				copy(c.open[k:], c.open[k+1:c.nopen])
				c.nopen--
			}
			break
		}
		if joined {
			continue
		}
		g := group{first: i, last: i, count: 1, hl: hl, seg: pl, payload: pl, tcp: tcp}
		if tcp {
			t := pkt[ipHeaderLen(pkt):]
			g.nextSeq = binary.BigEndian.Uint32(t[tcpSeq:]) + uint32(pl)
			if t[tcpFlags]&tcpFlagPSH != 0 {
				g.closed, g.psh = true, true
			}
		}
		c.member[i] = len(c.groups)
		if c.nopen == groupsMax {
			copy(c.open[:], c.open[1:])
			c.nopen--
		}
		c.open[c.nopen] = len(c.groups)
		c.nopen++
		c.groups = append(c.groups, g)
	}
}

// closeAddrs closes the open groups with pkt's IP addresses, or all of
// them if pkt is not IP.
func (c *coalescer) closeAddrs(bufs [][]byte, offset int, pkt []byte) {
	addrs := addrsOf(pkt)
	k := 0
	for _, m := range c.open[:c.nopen] {
		if addrs != nil && string(addrsOf(bufs[c.groups[m].first][offset:])) != string(addrs) {
			c.open[k] = m
			k++
		}
	}
	c.nopen = k
}

// addrsOf returns the source and destination addresses of an IPv4 or IPv6
// packet, nil for anything else.
func addrsOf(pkt []byte) []byte {
	switch {
	case len(pkt) >= ipv4HeaderLen && pkt[0]>>4 == 4:
		return pkt[12:20]
	case len(pkt) >= ipv6HeaderLen && pkt[0]>>4 == 6:
		return pkt[8:40]
	}
	return nil
}

func ipHeaderLen(pkt []byte) int {
	if pkt[0]>>4 == 4 {
		return ipv4HeaderLen
	}
	return ipv6HeaderLen
}

// writes returns the number of writes the plan comes to (packets written
// alone and super-packets), counting up to limit at most.
func (c *coalescer) writes(limit int) int {
	n := 0
	for i, m := range c.member {
		if n == limit {
			break
		}
		if m < 0 || c.groups[m].first == i {
			n++
		}
	}
	return n
}

// superHeader turns the first packet of g, whose virtio header room
// starts at b[0], into the head of the super-packet: IP length (and IPv4
// header checksum), the pseudo-header sum in the transport checksum field
// (CHECKSUM_PARTIAL), UDP length, PSH if the last segment had it, and the
// virtio header asking the kernel for GSO.
func superHeader(b []byte, g *group) {
	pkt := b[vnetHdrLen:]
	ipl := ipHeaderLen(pkt)
	total := g.hl + g.payload
	var addrs []byte
	h := vnetHdr{flags: unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, hdrLen: uint16(g.hl), gsoSize: uint16(g.seg), csumStart: uint16(ipl)}
	if ipl == ipv4HeaderLen {
		binary.BigEndian.PutUint16(pkt[2:], uint16(total))
		pkt[10], pkt[11] = 0, 0
		binary.BigEndian.PutUint16(pkt[10:], packet.Checksum(pkt[:ipv4HeaderLen], 0))
		addrs = pkt[12:20]
		h.gsoType = unix.VIRTIO_NET_HDR_GSO_TCPV4
	} else {
		binary.BigEndian.PutUint16(pkt[4:], uint16(total-ipv6HeaderLen))
		addrs = pkt[8:40]
		h.gsoType = unix.VIRTIO_NET_HDR_GSO_TCPV6
	}
	t := pkt[ipl:]
	proto := uint8(unix.IPPROTO_TCP)
	if g.tcp {
		h.csumOffst = tcpCsum
		if g.psh {
			t[tcpFlags] |= tcpFlagPSH
		}
	} else {
		proto = unix.IPPROTO_UDP
		h.gsoType = unix.VIRTIO_NET_HDR_GSO_UDP_L4
		h.csumOffst = udpCsum
		binary.BigEndian.PutUint16(t[udpLen:], uint16(total-ipl))
	}
	binary.BigEndian.PutUint16(t[h.csumOffst:], packet.Fold(pseudoHeaderSum(addrs, proto, total-ipl)))
	h.encode(b)
}

// setIov points iov at b.
func setIov(iov *unix.Iovec, b []byte) {
	iov.Base = unsafe.SliceData(b)
	iov.SetLen(len(b))
}
