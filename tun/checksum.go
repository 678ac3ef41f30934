package tun

import (
	"encoding/binary"
	"math/bits"
)

// littleEndian reports whether the machine loads words little-endian: the
// checksum is summed in the machine's byte order and swapped at the end.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func swap16(v uint16) uint16 {
	if littleEndian {
		return bits.ReverseBytes16(v)
	}
	return v
}

// checksum returns the Internet checksum's ones'-complement sum of b
// added to initial, folded to 16 bits and not complemented. initial and
// the result are in network byte order (as the value of a big-endian
// 16-bit field). It sums 64 bytes per round with a carry chain.
func checksum(b []byte, initial uint16) uint16 {
	ac := uint64(swap16(initial))
	var c uint64
	for len(b) >= 64 {
		ac, c = bits.Add64(ac, binary.NativeEndian.Uint64(b[0:8]), 0)
		ac, c = bits.Add64(ac, binary.NativeEndian.Uint64(b[8:16]), c)
		ac, c = bits.Add64(ac, binary.NativeEndian.Uint64(b[16:24]), c)
		ac, c = bits.Add64(ac, binary.NativeEndian.Uint64(b[24:32]), c)
		ac, c = bits.Add64(ac, binary.NativeEndian.Uint64(b[32:40]), c)
		ac, c = bits.Add64(ac, binary.NativeEndian.Uint64(b[40:48]), c)
		ac, c = bits.Add64(ac, binary.NativeEndian.Uint64(b[48:56]), c)
		ac, c = bits.Add64(ac, binary.NativeEndian.Uint64(b[56:64]), c)
		ac, c = bits.Add64(ac, 0, c)
		ac += c // cannot carry again: ac is 0 if c is 1
		b = b[64:]
	}
	for len(b) >= 8 {
		ac, c = bits.Add64(ac, binary.NativeEndian.Uint64(b[:8]), 0)
		ac += c // cannot carry again: ac is at most 2^64-2 if c is 1
		b = b[8:]
	}
	if len(b) >= 4 {
		ac, c = bits.Add64(ac, uint64(binary.NativeEndian.Uint32(b[:4])), 0)
		ac += c
		b = b[4:]
	}
	if len(b) >= 2 {
		ac, c = bits.Add64(ac, uint64(binary.NativeEndian.Uint16(b[:2])), 0)
		ac += c
		b = b[2:]
	}
	if len(b) == 1 {
		// the odd byte is the high byte of a big-endian word
		v := uint64(b[0]) << 8
		if littleEndian {
			v = uint64(b[0])
		}
		ac, c = bits.Add64(ac, v, 0)
		ac += c
	}
	// fold 64 -> 32 -> 16 bits
	ac = ac>>32 + ac&0xffffffff
	ac = ac>>32 + ac&0xffffffff
	ac = ac>>16 + ac&0xffff
	ac = ac>>16 + ac&0xffff
	return swap16(uint16(ac))
}

// add16 adds two folded sums.
func add16(a, b uint16) uint16 {
	s := uint32(a) + uint32(b)
	return uint16(s>>16 + s&0xffff)
}

// pseudoHeader returns the folded sum of the TCP/UDP pseudo-header of an
// IPv4 (addresses of 8 bytes) or IPv6 (32 bytes) packet whose transport
// part is length bytes long.
func pseudoHeader(addrs []byte, proto uint8, length int) uint16 {
	s := checksum(addrs, uint16(proto))
	s = add16(s, uint16(length))
	if length > 0xffff {
		s = add16(s, uint16(length>>16))
	}
	return s
}
