package packet

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// IPv4 header flag bits, in the 16-bit flags and fragment offset field.
const (
	IPv4DontFragment  = 0x4000
	IPv4MoreFragments = 0x2000
	ipv4OffsetMask    = 0x1fff
)

// ErrFamily means an address is missing or of the wrong family for the
// header being built.
var ErrFamily = errors.New("packet: address family mismatch")

// ErrShortBuffer means a destination buffer is too small for what is built.
var ErrShortBuffer = errors.New("packet: buffer too small")

// IPv4Header is an IPv4 header as espd builds and reads it. Options are not
// built; ParseIPv4Header reports their presence through HeaderLen.
type IPv4Header struct {
	HeaderLen  int    // bytes, options included (parse only; Put writes 20)
	TOS        uint8  // DSCP << 2 | ECN
	TotalLen   uint16 // header and payload
	ID         uint16
	DF, MF     bool   // Don't Fragment, More Fragments
	FragOffset uint16 // in bytes, a multiple of 8
	TTL        uint8
	Protocol   uint8
	Checksum   uint16 // parse only; Put computes it
	Src, Dst   netip.Addr
}

// PutIPv4Header writes h as a 20-byte IPv4 header without options at the
// start of b, with a correct header checksum, and returns 20. h.HeaderLen
// and h.Checksum are ignored.
func PutIPv4Header(b []byte, h IPv4Header) (int, error) {
	if len(b) < IPv4HeaderLen {
		return 0, ErrShortBuffer
	}
	if !h.Src.Is4() || !h.Dst.Is4() {
		return 0, ErrFamily
	}
	b[0] = 0x45
	b[1] = h.TOS
	binary.BigEndian.PutUint16(b[2:4], h.TotalLen)
	binary.BigEndian.PutUint16(b[4:6], h.ID)
	ff := h.FragOffset >> 3 & ipv4OffsetMask
	if h.DF {
		ff |= IPv4DontFragment
	}
	if h.MF {
		ff |= IPv4MoreFragments
	}
	binary.BigEndian.PutUint16(b[6:8], ff)
	b[8] = h.TTL
	b[9] = h.Protocol
	b[10], b[11] = 0, 0
	s, d := h.Src.As4(), h.Dst.As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	binary.BigEndian.PutUint16(b[10:12], Checksum(b[:IPv4HeaderLen], 0))
	return IPv4HeaderLen, nil
}

// ipv4Lengths checks the start of the IPv4 packet pkt and returns its
// header length (options included) and total length, in bytes. It checks,
// in this order: 20 bytes present (ErrTruncated), version 4 (ErrVersion),
// IHL at least 5 (ErrHeaderLength), total length at least the header
// (ErrTotalLength) and within pkt (ErrTruncated); so hl <= tl <= len(pkt).
// It does not verify the header checksum. Unlike ParseIPv4Header, an IHL
// past the end of pkt with a total length below it gives ErrTotalLength.
func ipv4Lengths(pkt []byte) (hl, tl int, err error) {
	if len(pkt) < IPv4HeaderLen {
		return 0, 0, ErrTruncated
	}
	if pkt[0]>>4 != 4 {
		return 0, 0, ErrVersion
	}
	hl = int(pkt[0]&0x0f) * 4
	if hl < IPv4HeaderLen {
		return 0, 0, ErrHeaderLength
	}
	tl = int(binary.BigEndian.Uint16(pkt[2:4]))
	if tl < hl {
		return 0, 0, ErrTotalLength
	}
	if tl > len(pkt) {
		return 0, 0, ErrTruncated
	}
	return hl, tl, nil
}

// ParseIPv4Header reads the IPv4 header at the start of b, as a raw IPv4
// socket delivers it in front of the payload. It checks the version, the
// header length, the total length (which must fit in b; bytes past it are
// the caller's to ignore) and the header checksum.
func ParseIPv4Header(b []byte) (IPv4Header, error) {
	if len(b) < IPv4HeaderLen {
		return IPv4Header{}, ErrTruncated
	}
	if b[0]>>4 != 4 {
		return IPv4Header{}, ErrVersion
	}
	hl := int(b[0]&0x0f) * 4
	if hl < IPv4HeaderLen {
		return IPv4Header{}, ErrHeaderLength
	}
	if hl > len(b) {
		return IPv4Header{}, ErrTruncated
	}
	tl := binary.BigEndian.Uint16(b[2:4])
	if int(tl) < hl {
		return IPv4Header{}, ErrTotalLength
	}
	if int(tl) > len(b) {
		return IPv4Header{}, ErrTruncated
	}
	if Checksum(b[:hl], 0) != 0 {
		return IPv4Header{}, ErrChecksum
	}
	ff := binary.BigEndian.Uint16(b[6:8])
	return IPv4Header{
		HeaderLen:  hl,
		TOS:        b[1],
		TotalLen:   tl,
		ID:         binary.BigEndian.Uint16(b[4:6]),
		DF:         ff&IPv4DontFragment != 0,
		MF:         ff&IPv4MoreFragments != 0,
		FragOffset: (ff & ipv4OffsetMask) << 3,
		TTL:        b[8],
		Protocol:   b[9],
		Checksum:   binary.BigEndian.Uint16(b[10:12]),
		Src:        netip.AddrFrom4([4]byte(b[12:16])),
		Dst:        netip.AddrFrom4([4]byte(b[16:20])),
	}, nil
}
