package packet

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// ICMP constants for path MTU discovery.
const (
	ICMPv4DestUnreach     = 3   // ICMP Destination Unreachable
	ICMPv4FragNeededCode  = 4   // code: fragmentation needed and DF set
	ICMPv6PacketTooBigMsg = 2   // ICMPv6 Packet Too Big
	icmpv4MaxErrorLen     = 576 // RFC 1812 section 4.3.2.3
	icmpv6MaxErrorLen     = 1280
	icmpErrorTTL          = 64
	icmpv4ErrorTOS        = 0xc0 // precedence internetwork control, as Linux
)

// Errors returned by the ICMP error builders.
var (
	// ErrNoICMP means the offending packet must not draw an ICMP error
	// (RFC 1122 section 3.2.2, RFC 4443 section 2.4): it is itself an ICMP
	// error, a non-first fragment, or its source is not a unicast host.
	ErrNoICMP = errors.New("packet: no ICMP error allowed for this packet")
	// ErrMTU means the MTU does not fit the message's MTU field.
	ErrMTU = errors.New("packet: MTU out of range for ICMP message")
)

// PacketTooBig builds, in dst, an ICMPv4 "fragmentation needed" or an
// ICMPv6 "packet too big" error for the offending packet pkt, depending on
// its version; see ICMPv4FragNeeded and ICMPv6PacketTooBig.
func PacketTooBig(dst []byte, src netip.Addr, pkt []byte, mtu int) (int, error) {
	if len(pkt) < 1 {
		return 0, ErrTruncated
	}
	switch pkt[0] >> 4 {
	case 4:
		return ICMPv4FragNeeded(dst, src, pkt, mtu)
	case 6:
		return ICMPv6PacketTooBig(dst, src, pkt, mtu)
	}
	return 0, ErrVersion
}

// ICMPv4FragNeeded builds, at the start of dst, an IPv4 packet from src to
// the source of the IPv4 packet pkt, carrying an ICMP Destination
// Unreachable, Fragmentation Needed and DF Set message (type 3, code 4)
// with next-hop MTU mtu (RFC 1191). It quotes as much of pkt as keeps the
// whole error within 576 bytes (RFC 1812 section 4.3.2.3; at least the IP
// header and 8 bytes, RFC 792) and as dst has room for, and returns the
// length written. Whether pkt had DF set is the caller's to check. dst must
// not overlap pkt. It returns ErrNoICMP for packets that must not draw an
// error.
func ICMPv4FragNeeded(dst []byte, src netip.Addr, pkt []byte, mtu int) (int, error) {
	if !src.Is4() {
		return 0, ErrFamily
	}
	if mtu < 68 || mtu > 0xffff {
		return 0, ErrMTU
	}
	hl, tl, err := ipv4Lengths(pkt)
	if err != nil {
		return 0, err
	}
	osrc := netip.AddrFrom4([4]byte(pkt[12:16]))
	odst := netip.AddrFrom4([4]byte(pkt[16:20]))
	if !unicastHost4(osrc) || odst.IsMulticast() || odst == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return 0, ErrNoICMP
	}
	if binary.BigEndian.Uint16(pkt[6:8])&ipv4OffsetMask != 0 {
		return 0, ErrNoICMP
	}
	if pkt[9] == ProtoICMP {
		if tl < hl+1 {
			return 0, ErrNoICMP
		}
		switch pkt[hl] {
		case 3, 4, 5, 11, 12: // error messages
			return 0, ErrNoICMP
		}
	}
	q := min(tl, icmpv4MaxErrorLen-IPv4HeaderLen-ICMPHeaderLen, len(dst)-IPv4HeaderLen-ICMPHeaderLen)
	if q < min(tl, hl+8) {
		return 0, ErrShortBuffer
	}
	n := IPv4HeaderLen + ICMPHeaderLen + q
	copy(dst[IPv4HeaderLen+ICMPHeaderLen:n], pkt[:q])
	m := dst[IPv4HeaderLen:n]
	m[0], m[1] = ICMPv4DestUnreach, ICMPv4FragNeededCode
	m[2], m[3], m[4], m[5] = 0, 0, 0, 0
	binary.BigEndian.PutUint16(m[6:8], uint16(mtu))
	binary.BigEndian.PutUint16(m[2:4], Checksum(m, 0))
	if _, err := PutIPv4Header(dst, IPv4Header{
		TOS: icmpv4ErrorTOS, TotalLen: uint16(n), TTL: icmpErrorTTL,
		Protocol: ProtoICMP, Src: src, Dst: osrc,
	}); err != nil {
		return 0, err
	}
	return n, nil
}

// unicastHost4 reports whether a is an IPv4 address that names a single
// host (RFC 1122 section 3.2.2): not 0/8, loopback, multicast, class E or
// the limited broadcast.
func unicastHost4(a netip.Addr) bool {
	b := a.As4()
	return b[0] != 0 && b[0] != 127 && b[0] < 224
}

// ICMPv6PacketTooBig builds, at the start of dst, an IPv6 packet from src
// to the source of the IPv6 packet pkt, carrying an ICMPv6 Packet Too Big
// message (type 2) with MTU mtu. It quotes as much of pkt as keeps the
// whole error within the IPv6 minimum MTU of 1280 bytes (RFC 4443 sections
// 2.4 and 3.2) and as dst has room for (at least the IPv6 header and 8
// bytes), and returns the length written. Unlike other errors, Packet Too
// Big answers multicast destinations (RFC 4443 section 2.4 e.3). dst must
// not overlap pkt. It returns ErrNoICMP for packets that must not draw an
// error.
func ICMPv6PacketTooBig(dst []byte, src netip.Addr, pkt []byte, mtu int) (int, error) {
	if !src.Is6() || src.Is4In6() {
		return 0, ErrFamily
	}
	if mtu < 0 || int64(mtu) > 0xffffffff {
		return 0, ErrMTU
	}
	if len(pkt) < IPv6HeaderLen {
		return 0, ErrTruncated
	}
	if pkt[0]>>4 != 6 {
		return 0, ErrVersion
	}
	tl := IPv6HeaderLen + int(binary.BigEndian.Uint16(pkt[4:6]))
	if tl > len(pkt) {
		return 0, ErrTruncated
	}
	osrc := netip.AddrFrom16([16]byte(pkt[8:24]))
	if osrc.IsUnspecified() || osrc.IsMulticast() || osrc.IsLoopback() {
		return 0, ErrNoICMP
	}
	nh, off, frag, err := skipExtensions(pkt[:tl], pkt[6], IPv6HeaderLen)
	if err == nil && !frag && nh == ProtoICMPv6 {
		if off >= tl || pkt[off] < 128 { // an error message, or unknown
			return 0, ErrNoICMP
		}
	}
	q := min(tl, icmpv6MaxErrorLen-IPv6HeaderLen-ICMPHeaderLen, len(dst)-IPv6HeaderLen-ICMPHeaderLen)
	if q < min(tl, IPv6HeaderLen+8) {
		return 0, ErrShortBuffer
	}
	n := IPv6HeaderLen + ICMPHeaderLen + q
	copy(dst[IPv6HeaderLen+ICMPHeaderLen:n], pkt[:q])
	m := dst[IPv6HeaderLen:n]
	m[0], m[1], m[2], m[3] = ICMPv6PacketTooBigMsg, 0, 0, 0
	binary.BigEndian.PutUint32(m[4:8], uint32(mtu))
	binary.BigEndian.PutUint16(m[2:4], Checksum(m, PseudoHeaderSum(ProtoICMPv6, src, osrc, len(m))))
	if _, err := PutIPv6Header(dst, IPv6Header{
		PayloadLen: uint16(len(m)), NextHeader: ProtoICMPv6, HopLimit: icmpErrorTTL,
		Src: src, Dst: osrc,
	}); err != nil {
		return 0, err
	}
	return n, nil
}
