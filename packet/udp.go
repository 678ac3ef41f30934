package packet

import (
	"encoding/binary"
	"net/netip"
)

// PutUDPHeader writes a UDP header for payloadLen bytes of payload at the
// start of b, with checksum 0, and returns 8. A zero checksum is allowed
// over IPv4 and is what RFC 3948 asks for ESP-in-UDP; over IPv6 call
// SetUDPChecksum once the payload is in place.
func PutUDPHeader(b []byte, srcPort, dstPort uint16, payloadLen int) (int, error) {
	if len(b) < UDPHeaderLen {
		return 0, ErrShortBuffer
	}
	if payloadLen < 0 || payloadLen > 0xffff-UDPHeaderLen {
		return 0, ErrTotalLength
	}
	binary.BigEndian.PutUint16(b[0:2], srcPort)
	binary.BigEndian.PutUint16(b[2:4], dstPort)
	binary.BigEndian.PutUint16(b[4:6], uint16(UDPHeaderLen+payloadLen))
	b[6], b[7] = 0, 0
	return UDPHeaderLen, nil
}

// SetUDPChecksum computes the checksum of the UDP datagram udp (header and
// payload, as long as its length field says) over the IPv4 or IPv6
// pseudo-header of src and dst, and stores it. A computed 0 is sent as
// 0xffff (RFC 768, RFC 8200 section 8.1).
func SetUDPChecksum(udp []byte, src, dst netip.Addr) error {
	if len(udp) < UDPHeaderLen {
		return ErrTruncated
	}
	l := int(binary.BigEndian.Uint16(udp[4:6]))
	if l < UDPHeaderLen || l > len(udp) {
		return ErrTotalLength
	}
	if src.Is4() != dst.Is4() || !src.IsValid() || !dst.IsValid() {
		return ErrFamily
	}
	udp[6], udp[7] = 0, 0
	c := Checksum(udp[:l], PseudoHeaderSum(ProtoUDP, src, dst, l))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:8], c)
	return nil
}

// SetTCPChecksum computes the checksum of the TCP segment tcp (header and
// payload, all of it) over the IPv4 or IPv6 pseudo-header of src and dst,
// and stores it.
func SetTCPChecksum(tcp []byte, src, dst netip.Addr) error {
	if len(tcp) < 20 {
		return ErrTruncated
	}
	if src.Is4() != dst.Is4() || !src.IsValid() || !dst.IsValid() {
		return ErrFamily
	}
	tcp[16], tcp[17] = 0, 0
	binary.BigEndian.PutUint16(tcp[16:18], Checksum(tcp, PseudoHeaderSum(ProtoTCP, src, dst, len(tcp))))
	return nil
}
