// Package packet holds the IP header helpers that esp and the data plane
// share: flow (selector 5-tuple) parsing, the Internet checksum, outer IPv4,
// IPv6 and UDP header building, IPv4 header parsing, DSCP and ECN access,
// ICMP "packet too big" errors and IPv4 fragmentation.
//
// Every function is pure: it works on the byte slices it is given, does no
// I/O and does not allocate. Functions that read packets from the network
// return an error naming the reason instead of panicking on bad input.
package packet

// IP protocol numbers (IPv4 Protocol, IPv6 Next Header) used by espd.
const (
	ProtoHopByHop = 0   // IPv6 Hop-by-Hop Options
	ProtoICMP     = 1   // ICMP for IPv4
	ProtoIPIP     = 4   // IPv4 encapsulation (ESP tunnel mode, IPv4 inner)
	ProtoTCP      = 6   // TCP
	ProtoUDP      = 17  // UDP
	ProtoIPv6     = 41  // IPv6 encapsulation (ESP tunnel mode, IPv6 inner)
	ProtoRouting  = 43  // IPv6 Routing header
	ProtoFragment = 44  // IPv6 Fragment header
	ProtoESP      = 50  // Encapsulating Security Payload
	ProtoICMPv6   = 58  // ICMP for IPv6
	ProtoNoNext   = 59  // IPv6 No Next Header (ESP dummy packets)
	ProtoDstOpts  = 60  // IPv6 Destination Options
	ProtoSCTP     = 132 // SCTP
	ProtoUDPLite  = 136 // UDP-Lite
)

// Fixed header lengths.
const (
	IPv4HeaderLen = 20 // IPv4 header without options
	IPv6HeaderLen = 40 // IPv6 fixed header
	UDPHeaderLen  = 8  // UDP header
	ICMPHeaderLen = 8  // ICMP/ICMPv6 error message header
)
