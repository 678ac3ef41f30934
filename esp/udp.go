package esp

// UDPKind classifies the payload of a datagram received on an ESP-in-UDP
// port (RFC 3948 section 2).
type UDPKind uint8

// UDP payload kinds.
const (
	// UDPMalformed is none of the others: drop it.
	UDPMalformed UDPKind = iota
	// UDPESP is an ESP packet: at least 8 bytes with a non-zero SPI.
	UDPESP
	// UDPIKE is an IKE message behind the 4-byte zero non-ESP marker.
	UDPIKE
	// UDPKeepalive is a NAT-keepalive: the single byte 0xFF.
	UDPKeepalive
)

// String names the kind.
func (k UDPKind) String() string {
	switch k {
	case UDPMalformed:
		return "malformed"
	case UDPESP:
		return "esp"
	case UDPIKE:
		return "ike"
	case UDPKeepalive:
		return "keepalive"
	}
	return "UDPKind(?)"
}

// NonESPMarkerLen is the length of the zero non-ESP marker in front of IKE
// messages on the ESP-in-UDP port.
const NonESPMarkerLen = 4

// ikeHeaderLen is the length of the IKE header (RFC 7296 section 3.1).
const ikeHeaderLen = 28

// KeepaliveByte is the one-byte payload of a NAT-keepalive (RFC 3948
// section 2.3).
const KeepaliveByte = 0xff

// ClassifyUDP tells what a UDP payload on the ESP-in-UDP port is: the
// keepalive byte 0xFF alone; an IKE message (the zero non-ESP marker
// followed by at least an IKE header); ESP (at least the 8-byte ESP header,
// SPI not zero); or, for anything else, malformed.
func ClassifyUDP(payload []byte) UDPKind {
	switch {
	case len(payload) == 1 && payload[0] == KeepaliveByte:
		return UDPKeepalive
	case len(payload) < HeaderLen:
		return UDPMalformed
	case payload[0]|payload[1]|payload[2]|payload[3] != 0:
		return UDPESP
	case len(payload) >= NonESPMarkerLen+ikeHeaderLen:
		return UDPIKE
	}
	return UDPMalformed
}

// PutKeepalive writes a NAT-keepalive payload at the start of b and returns
// its length, 1 (0 if b is empty).
func PutKeepalive(b []byte) int {
	if len(b) < 1 {
		return 0
	}
	b[0] = KeepaliveByte
	return 1
}
