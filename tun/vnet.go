package tun

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/packet"
)

// The TUN device runs with IFF_VNET_HDR: every packet read or written is
// preceded by a struct virtio_net_hdr that describes checksum and
// segmentation offload. The kernel then hands over TCP (and, since Linux
// 6.2, UDP) super-packets of up to 64 KiB that Read splits, and accepts
// such super-packets, which Write builds from consecutive segments of a
// flow, so that the stack behind the TUN handles one packet where there
// were dozens.

// vnetHdrLen is the size of struct virtio_net_hdr.
const vnetHdrLen = 10

// Offsets of the virtio_net_hdr fields. Multi-byte fields are in the
// machine's byte order (legacy virtio, as TUN uses unless told otherwise).
const (
	vnetFlags      = 0
	vnetGSOType    = 1
	vnetHdrLenOff  = 2
	vnetGSOSize    = 4
	vnetCsumStart  = 6
	vnetCsumOffset = 8
)

// vnetHdr is a decoded struct virtio_net_hdr.
type vnetHdr struct {
	flags, gsoType       uint8
	hdrLen, gsoSize      uint16
	csumStart, csumOffst uint16
}

func (h *vnetHdr) decode(b []byte) {
	h.flags = b[vnetFlags]
	h.gsoType = b[vnetGSOType]
	h.hdrLen = binary.NativeEndian.Uint16(b[vnetHdrLenOff:])
	h.gsoSize = binary.NativeEndian.Uint16(b[vnetGSOSize:])
	h.csumStart = binary.NativeEndian.Uint16(b[vnetCsumStart:])
	h.csumOffst = binary.NativeEndian.Uint16(b[vnetCsumOffset:])
}

func (h *vnetHdr) encode(b []byte) {
	b[vnetFlags] = h.flags
	b[vnetGSOType] = h.gsoType
	binary.NativeEndian.PutUint16(b[vnetHdrLenOff:], h.hdrLen)
	binary.NativeEndian.PutUint16(b[vnetGSOSize:], h.gsoSize)
	binary.NativeEndian.PutUint16(b[vnetCsumStart:], h.csumStart)
	binary.NativeEndian.PutUint16(b[vnetCsumOffset:], h.csumOffst)
}

// Offloads espd asks of the TUN device: checksum and TCP segmentation
// (required), UDP segmentation (Linux 6.2, optional).
const (
	offloadsTCP = unix.TUN_F_CSUM | unix.TUN_F_TSO4 | unix.TUN_F_TSO6
	offloadsUDP = unix.TUN_F_USO4 | unix.TUN_F_USO6
)

// Transport header offsets.
const (
	tcpSeq        = 4
	tcpAck        = 8
	tcpDataOff    = 12
	tcpFlags      = 13
	tcpWindow     = 14
	tcpCsum       = 16
	udpLen        = 4
	udpCsum       = 6
	tcpFlagFIN    = 0x01
	tcpFlagPSH    = 0x08
	tcpFlagACK    = 0x10
	tcpFlagCWR    = 0x80
	ipv4HeaderLen = 20
	ipv6HeaderLen = 40
)

// pseudoHeaderSum returns the partial sum (packet.Sum) of the TCP/UDP
// pseudo-header of an IPv4 or IPv6 packet whose addresses, as they lie in
// its header, are addrs (8 or 32 bytes) and whose transport part is length
// bytes long.
func pseudoHeaderSum(addrs []byte, proto uint8, length int) uint32 {
	return packet.Sum(addrs, uint32(proto)+uint32(length))
}

var errVnet = errors.New("tun: malformed virtio-net header or super-packet")

// splitter holds a super-packet read from the TUN while Read hands out its
// segments, over as many calls as the caller's buffers need: unlike the
// wireguard-go driver, which drops the segments that do not fit, nothing
// is lost when a small MSS makes a 64 KiB super-packet hundreds of
// segments long.
type splitter struct {
	pkt   []byte // the super-packet without its virtio header
	hdr   vnetHdr
	v6    bool
	tcp   bool
	first uint32 // TCP: first segment's sequence number; IPv4: its ID
	id    uint16
	next  int // offset of the next segment's payload in pkt
	seg   int // index of the next segment
}

// pending reports whether segments are left.
func (s *splitter) pending() bool { return s.pkt != nil }

// start takes the super-packet in (virtio header included) and checks it.
// It returns 1 and nil after finishing a packet that needs no split
// (written to bufs[0][offset:] with its checksum completed), 0 and nil when
// the segments are pending.
func (s *splitter) start(in []byte, buf []byte, size *int) (int, error) {
	if len(in) < vnetHdrLen {
		return 0, errVnet
	}
	var h vnetHdr
	h.decode(in)
	pkt := in[vnetHdrLen:]
	if h.gsoType == unix.VIRTIO_NET_HDR_GSO_NONE {
		if h.flags&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 {
			at := int(h.csumStart) + int(h.csumOffst)
			if at+2 > len(pkt) || int(h.csumStart) > len(pkt) {
				return 0, errVnet
			}
			// The field holds the pseudo-header's sum (CHECKSUM_PARTIAL).
			initial := binary.BigEndian.Uint16(pkt[at:])
			pkt[at], pkt[at+1] = 0, 0
			c := packet.Checksum(pkt[h.csumStart:], uint32(initial))
			if c == 0 {
				c = 0xffff
			}
			binary.BigEndian.PutUint16(pkt[at:], c)
		}
		if len(pkt) > len(buf) {
			return 0, fmt.Errorf("tun: %d-byte packet larger than the %d-byte buffer", len(pkt), len(buf))
		}
		*size = copy(buf, pkt)
		return 1, nil
	}
	if len(pkt) == 0 {
		return 0, errVnet
	}
	v := pkt[0] >> 4
	switch h.gsoType &^ unix.VIRTIO_NET_HDR_GSO_ECN {
	case unix.VIRTIO_NET_HDR_GSO_TCPV4:
		s.tcp = true
		if v != 4 {
			return 0, errVnet
		}
	case unix.VIRTIO_NET_HDR_GSO_TCPV6:
		s.tcp = true
		if v != 6 {
			return 0, errVnet
		}
	case unix.VIRTIO_NET_HDR_GSO_UDP_L4:
		s.tcp = false
		if v != 4 && v != 6 {
			return 0, errVnet
		}
	default:
		return 0, fmt.Errorf("tun: unsupported GSO type %d", h.gsoType)
	}
	s.v6 = v == 6
	// The kernel's hdr_len may cover the whole first segment on the
	// forwarding path: recompute it from the transport header.
	cs := int(h.csumStart)
	if s.v6 && cs < ipv6HeaderLen || !s.v6 && cs < ipv4HeaderLen {
		return 0, errVnet
	}
	if s.tcp {
		if cs+tcpDataOff >= len(pkt) {
			return 0, errVnet
		}
		thl := int(pkt[cs+tcpDataOff]>>4) * 4
		if thl < 20 {
			return 0, errVnet
		}
		h.hdrLen = uint16(cs + thl)
	} else {
		h.hdrLen = uint16(cs + 8)
	}
	if int(h.hdrLen) >= len(pkt) || h.gsoSize == 0 {
		return 0, errVnet
	}
	s.pkt, s.hdr = pkt, h
	s.next, s.seg = int(h.hdrLen), 0
	if s.tcp {
		s.first = binary.BigEndian.Uint32(pkt[cs+tcpSeq:])
	}
	if !s.v6 {
		s.id = binary.BigEndian.Uint16(pkt[4:])
	}
	return 0, nil
}

// split writes the next segments into bufs[i][offset:] and their sizes, and
// returns how many it wrote. Each gets its own IP header (length, IPv4 ID
// and header checksum), transport header (TCP sequence number, FIN and PSH
// on the last segment only; UDP length) and full transport checksum.
func (s *splitter) split(bufs [][]byte, sizes []int, offset int) (int, error) {
	h := &s.hdr
	hl, cs := int(h.hdrLen), int(h.csumStart)
	addrs := s.pkt[12:20]
	if s.v6 {
		addrs = s.pkt[8:40]
	}
	proto := uint8(unix.IPPROTO_UDP)
	csumAt := cs + udpCsum
	if s.tcp {
		proto, csumAt = unix.IPPROTO_TCP, cs+tcpCsum
	}
	n := 0
	for ; n < len(bufs) && s.next < len(s.pkt); n++ {
		end := min(s.next+int(h.gsoSize), len(s.pkt))
		total := hl + end - s.next
		out := bufs[n][offset:]
		if len(out) < total {
			s.pkt = nil
			return n, fmt.Errorf("tun: %d-byte segment larger than the %d-byte buffer", total, len(out))
		}
		out = out[:total]
		copy(out, s.pkt[:hl])
		copy(out[hl:], s.pkt[s.next:end])
		if s.v6 {
			binary.BigEndian.PutUint16(out[4:], uint16(total-ipv6HeaderLen))
		} else {
			binary.BigEndian.PutUint16(out[2:], uint16(total))
			binary.BigEndian.PutUint16(out[4:], s.id+uint16(s.seg))
			out[10], out[11] = 0, 0
			binary.BigEndian.PutUint16(out[10:], packet.Checksum(out[:cs], 0))
		}
		t := out[cs:]
		if s.tcp {
			binary.BigEndian.PutUint32(t[tcpSeq:], s.first+uint32(s.seg)*uint32(h.gsoSize))
			if end != len(s.pkt) {
				t[tcpFlags] &^= tcpFlagFIN | tcpFlagPSH
			}
			if s.seg > 0 {
				t[tcpFlags] &^= tcpFlagCWR
			}
		} else {
			binary.BigEndian.PutUint16(t[udpLen:], uint16(len(t)))
		}
		out[csumAt], out[csumAt+1] = 0, 0
		c := packet.Checksum(t, pseudoHeaderSum(addrs, proto, len(t)))
		if c == 0 && !s.tcp {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(out[csumAt:], c)
		sizes[n] = total
		s.next = end
		s.seg++
	}
	if s.next >= len(s.pkt) {
		s.pkt = nil
	}
	return n, nil
}
