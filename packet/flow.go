package packet

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// Flow is what a selector matches on: the addresses, the upper-layer
// protocol and its ports. For ICMP and ICMPv6, SrcPort holds the type and
// DstPort the code, as XFRM selectors do. Ports are 0 for protocols without
// them and for IPv4 or IPv6 fragments other than the first.
type Flow struct {
	Src, Dst         netip.Addr
	Proto            uint8
	SrcPort, DstPort uint16
}

// Errors returned by the parsing functions of this package.
var (
	// ErrTruncated means the packet ends before a header it announces.
	ErrTruncated = errors.New("packet: truncated")
	// ErrVersion means the IP version nibble is neither 4 nor 6.
	ErrVersion = errors.New("packet: not an IPv4 or IPv6 packet")
	// ErrHeaderLength means an IPv4 IHL below 5 or past the packet.
	ErrHeaderLength = errors.New("packet: bad IPv4 header length")
	// ErrTotalLength means the IP length field is inconsistent with the
	// header length or longer than the packet.
	ErrTotalLength = errors.New("packet: bad IP total/payload length")
	// ErrExtension means an IPv6 extension header runs past the payload.
	ErrExtension = errors.New("packet: truncated IPv6 extension header")
	// ErrChecksum means an IPv4 header checksum does not verify.
	ErrChecksum = errors.New("packet: bad IPv4 header checksum")
)

// ParseFlow reads the flow of an IPv4 or IPv6 packet. It honours the IP
// length field (bytes past it are ignored), skips IPv4 options and the IPv6
// Hop-by-Hop, Routing, Destination Options and Fragment extension headers,
// and reads the ports of TCP, UDP, SCTP and UDP-Lite and the type and code
// of ICMP and ICMPv6. Non-first fragments carry no ports. It does not
// verify checksums. On error the returned Flow holds what was parsed before
// the fault (useful for logging), never more.
func ParseFlow(pkt []byte) (Flow, error) {
	if len(pkt) < 1 {
		return Flow{}, ErrTruncated
	}
	switch pkt[0] >> 4 {
	case 4:
		return parseFlow4(pkt)
	case 6:
		return parseFlow6(pkt)
	}
	return Flow{}, ErrVersion
}

func parseFlow4(pkt []byte) (Flow, error) {
	if len(pkt) < IPv4HeaderLen {
		return Flow{}, ErrTruncated
	}
	hl := int(pkt[0]&0x0f) * 4
	if hl < IPv4HeaderLen {
		return Flow{}, ErrHeaderLength
	}
	tl := int(binary.BigEndian.Uint16(pkt[2:4]))
	if tl < hl {
		return Flow{}, ErrTotalLength
	}
	if tl > len(pkt) {
		return Flow{}, ErrTruncated
	}
	f := Flow{
		Src:   netip.AddrFrom4([4]byte(pkt[12:16])),
		Dst:   netip.AddrFrom4([4]byte(pkt[16:20])),
		Proto: pkt[9],
	}
	if binary.BigEndian.Uint16(pkt[6:8])&0x1fff != 0 {
		return f, nil // non-first fragment: no transport header
	}
	return f, transportPorts(&f, pkt[hl:tl])
}

func parseFlow6(pkt []byte) (Flow, error) {
	if len(pkt) < IPv6HeaderLen {
		return Flow{}, ErrTruncated
	}
	end := IPv6HeaderLen + int(binary.BigEndian.Uint16(pkt[4:6]))
	if end > len(pkt) {
		return Flow{}, ErrTruncated
	}
	f := Flow{
		Src: netip.AddrFrom16([16]byte(pkt[8:24])),
		Dst: netip.AddrFrom16([16]byte(pkt[24:40])),
	}
	nh, off, frag, err := skipExtensions(pkt[:end], pkt[6], IPv6HeaderLen)
	f.Proto = nh
	if err != nil || frag {
		return f, err
	}
	return f, transportPorts(&f, pkt[off:end])
}

// skipExtensions walks the IPv6 extension headers of pkt starting with
// next header nh at offset off. It returns the upper-layer protocol, its
// offset, and whether the packet is a fragment other than the first (whose
// upper-layer header is not present).
func skipExtensions(pkt []byte, nh uint8, off int) (uint8, int, bool, error) {
	for {
		switch nh {
		case ProtoHopByHop, ProtoRouting, ProtoDstOpts:
			if off+2 > len(pkt) {
				return nh, off, false, ErrExtension
			}
			l := (int(pkt[off+1]) + 1) * 8
			if off+l > len(pkt) {
				return nh, off, false, ErrExtension
			}
			nh = pkt[off]
			off += l
		case ProtoFragment:
			if off+8 > len(pkt) {
				return nh, off, false, ErrExtension
			}
			next := pkt[off]
			fo := binary.BigEndian.Uint16(pkt[off+2:off+4]) &^ 7
			off += 8
			nh = next
			if fo != 0 {
				return nh, off, true, nil
			}
		default:
			return nh, off, false, nil
		}
	}
}

// transportPorts fills the ports (or ICMP type and code) of f from the
// upper-layer header at the start of l4.
func transportPorts(f *Flow, l4 []byte) error {
	switch f.Proto {
	case ProtoTCP, ProtoUDP, ProtoSCTP, ProtoUDPLite:
		if len(l4) < 4 {
			return ErrTruncated
		}
		f.SrcPort = binary.BigEndian.Uint16(l4[0:2])
		f.DstPort = binary.BigEndian.Uint16(l4[2:4])
	case ProtoICMP, ProtoICMPv6:
		if len(l4) < 2 {
			return ErrTruncated
		}
		f.SrcPort = uint16(l4[0])
		f.DstPort = uint16(l4[1])
	}
	return nil
}
