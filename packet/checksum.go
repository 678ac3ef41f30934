package packet

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// littleEndian reports whether the machine loads words little-endian.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// Sum adds the bytes of b, as big-endian 16-bit words, to the partial
// one's-complement sum initial and returns the new partial sum. A trailing
// odd byte counts as the high byte of a word padded with zero, so every
// chunk but the last passed to successive calls must have even length.
// Fold and complement the result (or use Checksum) to get a checksum.
func Sum(b []byte, initial uint32) uint32 {
	ac := uint64(initial)
	var c uint64
	if len(b) >= 64 {
		// 64 bytes per round with a carry chain, loaded in the machine's
		// byte order: the one's-complement sum does not depend on byte
		// order (RFC 1071 section 2(B)). Reversing the bytes of the 64-bit
		// sum multiplies it by 2^8 modulo 0xffff, as swapping the bytes of
		// each 16-bit word would, which brings it to network order.
		var n uint64
		for len(b) >= 64 {
			n, c = bits.Add64(n, binary.NativeEndian.Uint64(b[0:8]), 0)
			n, c = bits.Add64(n, binary.NativeEndian.Uint64(b[8:16]), c)
			n, c = bits.Add64(n, binary.NativeEndian.Uint64(b[16:24]), c)
			n, c = bits.Add64(n, binary.NativeEndian.Uint64(b[24:32]), c)
			n, c = bits.Add64(n, binary.NativeEndian.Uint64(b[32:40]), c)
			n, c = bits.Add64(n, binary.NativeEndian.Uint64(b[40:48]), c)
			n, c = bits.Add64(n, binary.NativeEndian.Uint64(b[48:56]), c)
			n, c = bits.Add64(n, binary.NativeEndian.Uint64(b[56:64]), c)
			n += c // cannot carry again: n is at most 2^64-2 if c is 1
			b = b[64:]
		}
		if littleEndian {
			n = bits.ReverseBytes64(n)
		}
		ac, c = bits.Add64(ac, n, 0)
		ac += c
	}
	if len(b) >= 32 {
		ac, c = bits.Add64(ac, binary.BigEndian.Uint64(b), 0)
		ac, c = bits.Add64(ac, binary.BigEndian.Uint64(b[8:]), c)
		ac, c = bits.Add64(ac, binary.BigEndian.Uint64(b[16:]), c)
		ac, c = bits.Add64(ac, binary.BigEndian.Uint64(b[24:]), c)
		ac += c
		b = b[32:]
	}
	for len(b) >= 8 {
		ac, c = bits.Add64(ac, binary.BigEndian.Uint64(b), 0)
		ac += c
		b = b[8:]
	}
	if len(b) >= 4 {
		ac, c = bits.Add64(ac, uint64(binary.BigEndian.Uint32(b)), 0)
		ac += c
		b = b[4:]
	}
	if len(b) >= 2 {
		ac, c = bits.Add64(ac, uint64(binary.BigEndian.Uint16(b)), 0)
		ac += c
		b = b[2:]
	}
	if len(b) == 1 {
		ac, c = bits.Add64(ac, uint64(b[0])<<8, 0)
		ac += c
	}
	// Fold 64 bits to 32 with end-around carry: 2^32 is 1 modulo 0xffff.
	s := (ac >> 32) + (ac & 0xffffffff)
	s = (s >> 32) + (s & 0xffffffff)
	return uint32(s)
}

// Fold reduces a partial sum to 16 bits with end-around carry.
func Fold(sum uint32) uint16 {
	for sum > 0xffff {
		sum = (sum >> 16) + (sum & 0xffff)
	}
	return uint16(sum)
}

// Checksum returns the Internet checksum (RFC 1071) of b, starting from the
// partial sum initial (0, or a pseudo-header sum): the one's complement of
// the folded one's-complement sum. Over a region that includes a correct
// checksum field, the result is 0.
func Checksum(b []byte, initial uint32) uint16 {
	return ^Fold(Sum(b, initial))
}

// PseudoHeaderSum returns the partial sum of the IPv4 (RFC 768) or IPv6
// (RFC 8200 section 8.1) pseudo-header for an upper-layer packet of length
// bytes with protocol proto between src and dst. If the families differ, or
// an address is invalid, the sum covers only what is valid (callers check
// families before).
func PseudoHeaderSum(proto uint8, src, dst netip.Addr, length int) uint32 {
	var s uint32
	if src.Is4() {
		a := src.As4()
		s = Sum(a[:], s)
	} else if src.Is6() {
		a := src.As16()
		s = Sum(a[:], s)
	}
	if dst.Is4() {
		a := dst.As4()
		s = Sum(a[:], s)
	} else if dst.Is6() {
		a := dst.As16()
		s = Sum(a[:], s)
	}
	l := uint32(length)
	return s + l>>16 + l&0xffff + uint32(proto)
}

// UpdateChecksum16 returns checksum check after a 16-bit word of the
// covered data changed from old to new, as RFC 1624 equation 3 does:
// HC' = ~(~HC + ~m + m').
func UpdateChecksum16(check, old, new uint16) uint16 {
	s := uint32(^check) + uint32(^old) + uint32(new)
	return ^Fold(s)
}
