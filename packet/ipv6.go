package packet

import (
	"encoding/binary"
	"net/netip"
)

// IPv6Header is the IPv6 fixed header.
type IPv6Header struct {
	TrafficClass uint8  // DSCP << 2 | ECN
	FlowLabel    uint32 // low 20 bits
	PayloadLen   uint16 // bytes after the fixed header
	NextHeader   uint8
	HopLimit     uint8
	Src, Dst     netip.Addr
}

// PutIPv6Header writes h as the 40-byte IPv6 fixed header at the start of b
// and returns 40. Src and Dst must be IPv6 addresses (IPv4-mapped ones are
// written as such).
func PutIPv6Header(b []byte, h IPv6Header) (int, error) {
	if len(b) < IPv6HeaderLen {
		return 0, ErrShortBuffer
	}
	if !h.Src.Is6() || !h.Dst.Is6() {
		return 0, ErrFamily
	}
	binary.BigEndian.PutUint32(b[0:4], 6<<28|uint32(h.TrafficClass)<<20|h.FlowLabel&0xfffff)
	binary.BigEndian.PutUint16(b[4:6], h.PayloadLen)
	b[6] = h.NextHeader
	b[7] = h.HopLimit
	s, d := h.Src.As16(), h.Dst.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
	return IPv6HeaderLen, nil
}
