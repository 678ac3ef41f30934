package packet

import (
	"encoding/binary"
	"net/netip"
)

// Test-only API: what the tests use and espd does not.

// ParseIPv6Header reads the IPv6 fixed header at the start of b and checks
// that the payload length fits in b.
func ParseIPv6Header(b []byte) (IPv6Header, error) {
	if len(b) < IPv6HeaderLen {
		return IPv6Header{}, ErrTruncated
	}
	if b[0]>>4 != 6 {
		return IPv6Header{}, ErrVersion
	}
	pl := binary.BigEndian.Uint16(b[4:6])
	if IPv6HeaderLen+int(pl) > len(b) {
		return IPv6Header{}, ErrTruncated
	}
	v := binary.BigEndian.Uint32(b[0:4])
	return IPv6Header{
		TrafficClass: uint8(v >> 20),
		FlowLabel:    v & 0xfffff,
		PayloadLen:   pl,
		NextHeader:   b[6],
		HopLimit:     b[7],
		Src:          netip.AddrFrom16([16]byte(b[8:24])),
		Dst:          netip.AddrFrom16([16]byte(b[24:40])),
	}, nil
}

// UDPHeader is a parsed UDP header.
type UDPHeader struct {
	SrcPort, DstPort uint16
	Length           uint16 // header and payload
	Checksum         uint16 // 0: none (IPv4 only)
}

// ParseUDPHeader reads the UDP header at the start of b and returns it with
// the payload its length field delimits. It does not verify the checksum
// (see UDPChecksumValid).
func ParseUDPHeader(b []byte) (UDPHeader, []byte, error) {
	if len(b) < UDPHeaderLen {
		return UDPHeader{}, nil, ErrTruncated
	}
	h := UDPHeader{
		SrcPort:  binary.BigEndian.Uint16(b[0:2]),
		DstPort:  binary.BigEndian.Uint16(b[2:4]),
		Length:   binary.BigEndian.Uint16(b[4:6]),
		Checksum: binary.BigEndian.Uint16(b[6:8]),
	}
	if int(h.Length) < UDPHeaderLen {
		return UDPHeader{}, nil, ErrTotalLength
	}
	if int(h.Length) > len(b) {
		return UDPHeader{}, nil, ErrTruncated
	}
	return h, b[UDPHeaderLen:h.Length], nil
}

// UDPChecksumValid reports whether the UDP datagram udp carries a correct
// checksum for src and dst. A zero checksum over IPv4 means none was sent
// and is valid; over IPv6 it is not.
func UDPChecksumValid(udp []byte, src, dst netip.Addr) bool {
	if len(udp) < UDPHeaderLen {
		return false
	}
	l := int(binary.BigEndian.Uint16(udp[4:6]))
	if l < UDPHeaderLen || l > len(udp) {
		return false
	}
	if binary.BigEndian.Uint16(udp[6:8]) == 0 {
		return src.Is4()
	}
	return Checksum(udp[:l], PseudoHeaderSum(ProtoUDP, src, dst, l)) == 0
}
