package packet

import (
	"encoding/binary"
	"net/netip"
)

// refChecksum is a plain RFC 1071 checksum, 16 bits at a time, used to check
// the optimised one.
func refChecksum(chunks ...[]byte) uint16 {
	var s uint32
	for _, b := range chunks {
		for i := 0; i+1 < len(b); i += 2 {
			s += uint32(b[i])<<8 | uint32(b[i+1])
		}
		if len(b)%2 == 1 {
			s += uint32(b[len(b)-1]) << 8
		}
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// ipv4Packet builds an IPv4 packet with the given options, protocol and
// payload (options must be a multiple of 4 bytes).
func ipv4Packet(src, dst string, proto uint8, opts, payload []byte) []byte {
	hl := IPv4HeaderLen + len(opts)
	p := make([]byte, hl+len(payload))
	p[0] = 0x40 | byte(hl/4)
	binary.BigEndian.PutUint16(p[2:4], uint16(len(p)))
	binary.BigEndian.PutUint16(p[4:6], 0x1234)
	p[8] = 64
	p[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	copy(p[20:], opts)
	copy(p[hl:], payload)
	binary.BigEndian.PutUint16(p[10:12], refChecksum(p[:hl]))
	return p
}

// ipv6Packet builds an IPv6 packet whose chain starts with nh and whose
// payload (extension headers included) is payload.
func ipv6Packet(src, dst string, nh uint8, payload []byte) []byte {
	p := make([]byte, IPv6HeaderLen+len(payload))
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:6], uint16(len(payload)))
	p[6] = nh
	p[7] = 64
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(p[8:], s[:])
	copy(p[24:], d[:])
	copy(p[40:], payload)
	return p
}

// ports returns a transport header starting with the two ports.
func ports(sp, dp uint16, n int) []byte {
	b := make([]byte, n)
	binary.BigEndian.PutUint16(b[0:2], sp)
	binary.BigEndian.PutUint16(b[2:4], dp)
	return b
}

// ext returns an IPv6 extension header of 8*(1+l) bytes with next header nh.
func ext(nh uint8, l int) []byte {
	b := make([]byte, 8*(l+1))
	b[0] = nh
	b[1] = byte(l)
	return b
}

// fragHdr returns an IPv6 fragment header.
func fragHdr(nh uint8, offset int, more bool) []byte {
	b := make([]byte, 8)
	b[0] = nh
	v := uint16(offset)
	if more {
		v |= 1
	}
	binary.BigEndian.PutUint16(b[2:4], v)
	binary.BigEndian.PutUint32(b[4:8], 0xabcdef)
	return b
}

func cat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}
