package esp

import (
	"encoding/binary"
	"net/netip"

	"github.com/espd/espd/packet"
)

// IPHeader holds the IP header fields that transport mode keeps
// (RFC 4303 section 3.1.1): EncapsulateTransport reads them from the
// packet for the sender to write in front of the ESP header, and
// OpenTransport writes them back in front of the decrypted payload.
type IPHeader struct {
	Src, Dst netip.Addr
	// TOS is the IPv4 TOS or IPv6 Traffic Class (DSCP and ECN).
	TOS uint8
	// TTL is the TTL or hop limit.
	TTL uint8
	// ID and DF are IPv4's Identification and Don't Fragment.
	ID uint16
	DF bool
	// FlowLabel is IPv6's flow label.
	FlowLabel uint32
}

// TransportPacket locates a transport-mode ESP packet in its buffer,
// buf[ESP:End] from the SPI to the ICV, with the IP header fields the
// sender writes in front of it (protocol ESP, or UDP for ESP-in-UDP).
type TransportPacket struct {
	ESP, End int
	IPHeader
}

// EncapsulateTransport turns the IPv4 or IPv6 packet buf[off:off+n] into a
// transport-mode ESP packet with sequence number seq, in place: ESP
// protects what follows the IP header, with the header's protocol as Next
// Header, and the header's fields are returned for the sender, whose outer
// header replaces it (in the headroom that Encapsulate also needs). The
// packet's addresses must be Outer's Src and Dst: transport mode is
// between the SA's two endpoints. It carries whole datagrams only (RFC
// 4303 section 3.1.1) and no IPv4 options or IPv6 extension headers that
// go in front of ESP: such a packet gives ErrTransport. No TFC padding is
// added, since TCP carries no length of its own. The other errors are
// Encapsulate's.
func (e *Encapsulator) EncapsulateTransport(buf []byte, off, n int, seq uint64) (TransportPacket, error) {
	if off < 0 || n < 1 || off > cap(buf)-n {
		return TransportPacket{}, ErrInner
	}
	full := buf[:cap(buf)]
	h, hl, proto, err := transportHeader(full[off : off+n])
	if err != nil {
		return TransportPacket{}, err
	}
	if h.Src != e.Outer.Src || h.Dst != e.Outer.Dst {
		return TransportPacket{}, ErrTransport
	}
	p, err := e.encapsulate(full, off+hl, n-hl, seq, proto, true)
	if err != nil {
		return TransportPacket{}, err
	}
	return TransportPacket{ESP: p.ESP, End: p.End, IPHeader: h}, nil
}

// transportHeader parses the IP header of pkt for transport mode: its
// fields, its length and the upper-layer protocol after it.
func transportHeader(pkt []byte) (h IPHeader, hl int, proto uint8, err error) {
	switch pkt[0] >> 4 {
	case 4:
		ip, err := packet.ParseIPv4Header(pkt)
		if err != nil || int(ip.TotalLen) != len(pkt) {
			return h, 0, 0, ErrInner
		}
		if ip.HeaderLen != packet.IPv4HeaderLen || ip.MF || ip.FragOffset != 0 {
			return h, 0, 0, ErrTransport
		}
		h = IPHeader{Src: ip.Src, Dst: ip.Dst, TOS: ip.TOS, TTL: ip.TTL, ID: ip.ID, DF: ip.DF}
		return h, packet.IPv4HeaderLen, ip.Protocol, nil
	case 6:
		if len(pkt) < packet.IPv6HeaderLen || packet.IPv6HeaderLen+int(binary.BigEndian.Uint16(pkt[4:6])) != len(pkt) {
			return h, 0, 0, ErrInner
		}
		proto = pkt[6]
		if !upperLayer(proto) {
			return h, 0, 0, ErrTransport
		}
		h = IPHeader{
			Src: netip.AddrFrom16([16]byte(pkt[8:24])), Dst: netip.AddrFrom16([16]byte(pkt[24:40])),
			TOS: uint8(binary.BigEndian.Uint16(pkt[0:2]) >> 4), TTL: pkt[7],
			FlowLabel: binary.BigEndian.Uint32(pkt[0:4]) & 0xfffff,
		}
		return h, packet.IPv6HeaderLen, proto, nil
	}
	return h, 0, 0, ErrInner
}

// upperLayer reports whether transport-mode ESP may carry the protocol
// proto: not an IPv6 extension header that stays in front of ESP, not a
// tunnel-mode inner packet, not ESP's dummy.
func upperLayer(proto uint8) bool {
	switch proto {
	case packet.ProtoHopByHop, packet.ProtoRouting, packet.ProtoFragment, packet.ProtoDstOpts,
		NextHeaderIPv4, NextHeaderIPv6, NextHeaderDummy, packet.ProtoESP:
		return false
	}
	return true
}

// OpenTransport opens the transport-mode ESP packet buf[start:end] (from
// the SPI to the ICV) in place, as Open does, and writes the IP header h,
// with the Next Header as its protocol, in front of the decrypted payload.
// It returns the IP packet, a sub-slice of buf that starts before start:
// buf needs IPv6HeaderLen bytes in front of the payload, which the ESP
// header and IV give with 16 more in front of start. A Next Header that
// transport mode does not carry gives ErrNextHeader; the other errors are
// Open's. ECN: the header keeps h.TOS as it came (RFC 4303 transport mode
// has no inner header of its own). With UDPEncap the TCP or UDP checksum
// is recomputed over h's addresses (RFC 3948 section 3.1.2).
func (d *Decapsulator) OpenTransport(buf []byte, start, end int, h IPHeader) (pkt []byte, seq uint64, err error) {
	if start < 0 || end > len(buf) || start > end {
		return nil, 0, ErrMalformed
	}
	payload, nh, seq, err := d.open(buf[start:end])
	if err != nil {
		return nil, seq, err
	}
	if nh == NextHeaderDummy {
		return nil, seq, ErrDummy
	}
	if !upperLayer(nh) {
		return nil, seq, ErrNextHeader
	}
	at := start + HeaderLen + d.Transform.IVSize() // where the payload is
	n := len(payload)
	var hl int
	switch {
	case h.Src.Is4() && h.Dst.Is4():
		hl = packet.IPv4HeaderLen
		if at < hl || hl+n > 0xffff {
			return nil, seq, ErrMalformed
		}
		_, err = packet.PutIPv4Header(buf[at-hl:at], packet.IPv4Header{
			TOS: h.TOS, TotalLen: uint16(hl + n), ID: h.ID, DF: h.DF, TTL: h.TTL, Protocol: nh,
			Src: h.Src, Dst: h.Dst,
		})
	case h.Src.Is6() && h.Dst.Is6():
		hl = packet.IPv6HeaderLen
		if at < hl || n > 0xffff {
			return nil, seq, ErrMalformed
		}
		_, err = packet.PutIPv6Header(buf[at-hl:at], packet.IPv6Header{
			TrafficClass: h.TOS, FlowLabel: h.FlowLabel, PayloadLen: uint16(n), NextHeader: nh, HopLimit: h.TTL,
			Src: h.Src, Dst: h.Dst,
		})
	default:
		return nil, seq, ErrOuter
	}
	if err != nil {
		return nil, seq, ErrOuter
	}
	if d.UDPEncap {
		natChecksum(buf[at:at+n], nh, h.Src, h.Dst)
	}
	return buf[at-hl : at+n], seq, nil
}

// natChecksum recomputes the TCP or UDP checksum of the upper-layer packet
// l4 over the addresses it is delivered with: behind a NAT the sender
// computed it over addresses that the NAT rewrote (RFC 3948 section
// 3.1.2). ESP's ICV has already vouched for the bytes, so this is the
// kernel's choice of taking them as verified, made explicit for a stack
// that will verify. An IPv4 UDP datagram without a checksum keeps none.
// A packet too short for its header is left alone: the stack drops it.
func natChecksum(l4 []byte, proto uint8, src, dst netip.Addr) {
	switch proto {
	case packet.ProtoTCP:
		packet.SetTCPChecksum(l4, src, dst)
	case packet.ProtoUDP:
		if len(l4) >= packet.UDPHeaderLen && (src.Is6() || l4[6]|l4[7] != 0) {
			packet.SetUDPChecksum(l4, src, dst)
		}
	}
}
