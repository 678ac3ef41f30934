package packet

import "encoding/binary"

// ECN codepoints (RFC 3168), the low two bits of the IPv4 TOS and the IPv6
// Traffic Class.
const (
	ECNNotECT = 0 // Not ECN-Capable Transport
	ECNECT1   = 1 // ECN-Capable Transport (1)
	ECNECT0   = 2 // ECN-Capable Transport (0)
	ECNCE     = 3 // Congestion Experienced
	ECNMask   = 3
)

// TOS returns the IPv4 TOS byte or the IPv6 Traffic Class of pkt: DSCP in
// the high six bits, ECN in the low two. ok is false when pkt is not a long
// enough IPv4 or IPv6 packet.
func TOS(pkt []byte) (tos uint8, ok bool) {
	if len(pkt) < 1 {
		return 0, false
	}
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < IPv4HeaderLen {
			return 0, false
		}
		return pkt[1], true
	case 6:
		if len(pkt) < IPv6HeaderLen {
			return 0, false
		}
		return uint8(binary.BigEndian.Uint16(pkt[0:2]) >> 4), true
	}
	return 0, false
}

// SetTOS writes the IPv4 TOS byte (updating the header checksum
// incrementally) or the IPv6 Traffic Class of pkt. It reports false, and
// changes nothing, when pkt is not a long enough IPv4 or IPv6 packet.
func SetTOS(pkt []byte, tos uint8) bool {
	if len(pkt) < 1 {
		return false
	}
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < IPv4HeaderLen {
			return false
		}
		old := binary.BigEndian.Uint16(pkt[0:2])
		pkt[1] = tos
		c := UpdateChecksum16(binary.BigEndian.Uint16(pkt[10:12]), old, binary.BigEndian.Uint16(pkt[0:2]))
		binary.BigEndian.PutUint16(pkt[10:12], c)
		return true
	case 6:
		if len(pkt) < IPv6HeaderLen {
			return false
		}
		w := binary.BigEndian.Uint16(pkt[0:2])
		w = w&0xf00f | uint16(tos)<<4
		binary.BigEndian.PutUint16(pkt[0:2], w)
		return true
	}
	return false
}

// ECN returns the ECN field of pkt (ECNNotECT, ECNECT1, ECNECT0 or ECNCE).
func ECN(pkt []byte) (uint8, bool) {
	t, ok := TOS(pkt)
	return t & ECNMask, ok
}

// SetECN writes the ECN field of pkt, keeping its DSCP.
func SetECN(pkt []byte, ecn uint8) bool {
	t, ok := TOS(pkt)
	return ok && SetTOS(pkt, t&^ECNMask|ecn&ECNMask)
}
