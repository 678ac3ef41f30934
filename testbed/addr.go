package testbed

import "net/netip"

// Interface names. Every namespace has its own, so the names repeat.
const (
	// IfHost is the client's and the server's only link (to its gateway).
	IfHost = "eth0"
	// IfLAN is a gateway's link to its LAN (client or server).
	IfLAN = "lan0"
	// IfTransit is a gateway's link to the other gateway.
	IfTransit = "wan0"
)

// The address plan. Prefixes carry the interface address and its subnet.
var (
	// ClientV4 and ClientV6 are the client's addresses on LAN A.
	ClientV4 = netip.MustParsePrefix("198.18.1.2/24")
	ClientV6 = netip.MustParsePrefix("2001:db8:1::2/64")
	// GwALANV4 and GwALANV6 are gateway A's addresses on LAN A.
	GwALANV4 = netip.MustParsePrefix("198.18.1.1/24")
	GwALANV6 = netip.MustParsePrefix("2001:db8:1::1/64")
	// GwATransitV4 and GwATransitV6 are gateway A's transit addresses.
	GwATransitV4 = netip.MustParsePrefix("198.18.0.1/24")
	GwATransitV6 = netip.MustParsePrefix("2001:db8::1/64")
	// GwBTransitV4 and GwBTransitV6 are gateway B's transit addresses.
	GwBTransitV4 = netip.MustParsePrefix("198.18.0.2/24")
	GwBTransitV6 = netip.MustParsePrefix("2001:db8::2/64")
	// GwBLANV4 and GwBLANV6 are gateway B's addresses on LAN B.
	GwBLANV4 = netip.MustParsePrefix("198.18.2.1/24")
	GwBLANV6 = netip.MustParsePrefix("2001:db8:2::1/64")
	// ServerV4 and ServerV6 are the server's addresses on LAN B.
	ServerV4 = netip.MustParsePrefix("198.18.2.2/24")
	ServerV6 = netip.MustParsePrefix("2001:db8:2::2/64")
)

// Subnets of the three links.
var (
	LANAV4    = ClientV4.Masked()
	LANAV6    = ClientV6.Masked()
	LANBV4    = ServerV4.Masked()
	LANBV6    = ServerV6.Masked()
	TransitV4 = GwATransitV4.Masked()
)

// Family selects an IP version.
type Family int

// Address families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// String returns "IPv4" or "IPv6".
func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// Pick returns v4 for IPv4 and v6 for IPv6.
func Pick[T any](f Family, v4, v6 T) T {
	if f == IPv6 {
		return v6
	}
	return v4
}
