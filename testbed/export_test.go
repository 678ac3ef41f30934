package testbed

import "net/netip"

// Test-only API: what the tests use and no other package does.

// FamilyOf returns the family of a.
func FamilyOf(a netip.Addr) Family {
	if a.Is4() || a.Is4In6() {
		return IPv4
	}
	return IPv6
}
