package packet

import "net/netip"

// TunnelHeader is the outer header of a tunnelled packet: IPv4 or IPv6,
// then UDP when DstPort is not 0 (ESP-in-UDP, RFC 3948).
type TunnelHeader struct {
	Src, Dst         netip.Addr // both IPv4 or both IPv6
	SrcPort, DstPort uint16     // DstPort 0: no UDP header
	Protocol         uint8      // the payload's protocol without UDP (ProtoESP)
	TOS, TTL         uint8      // TOS or traffic class; TTL or hop limit
	DF               bool       // IPv4 Don't Fragment
	ID               uint16     // IPv4 Identification
	FlowLabel        uint32     // IPv6 flow label (transport mode keeps the packet's)
}

// Len returns the length of the header: 20 or 40, plus 8 with UDP.
func (h *TunnelHeader) Len() int {
	n := IPv4HeaderLen
	if h.Dst.Is6() && !h.Dst.Is4In6() {
		n = IPv6HeaderLen
	}
	if h.DstPort != 0 {
		n += UDPHeaderLen
	}
	return n
}

// PutTunnelHeader writes h in front of the payload b[start:end] and
// returns the complete packet, b[start-h.Len():end]. Over IPv4 the UDP
// checksum is 0, as RFC 3948 recommends for ESP-in-UDP; over IPv6 it is
// computed (RFC 8200 section 8.1).
func PutTunnelHeader(b []byte, start, end int, h TunnelHeader) ([]byte, error) {
	v4 := h.Src.Is4() && h.Dst.Is4()
	if !v4 && (!h.Src.Is6() || !h.Dst.Is6() || h.Src.Is4In6() || h.Dst.Is4In6()) {
		return nil, ErrFamily
	}
	hl := h.Len()
	if start < hl || start > end || end > len(b) {
		return nil, ErrShortBuffer
	}
	full := b[start-hl : end]
	proto := h.Protocol
	if h.DstPort != 0 {
		proto = ProtoUDP
		if _, err := PutUDPHeader(b[start-UDPHeaderLen:], h.SrcPort, h.DstPort, end-start); err != nil {
			return nil, err
		}
	}
	if v4 {
		_, err := PutIPv4Header(full, IPv4Header{
			TOS: h.TOS, TotalLen: uint16(len(full)), ID: h.ID, DF: h.DF,
			TTL: h.TTL, Protocol: proto, Src: h.Src, Dst: h.Dst,
		})
		return full, err
	}
	if len(full) > 0xffff+IPv6HeaderLen {
		return nil, ErrTotalLength
	}
	if _, err := PutIPv6Header(full, IPv6Header{
		TrafficClass: h.TOS, FlowLabel: h.FlowLabel, PayloadLen: uint16(len(full) - IPv6HeaderLen),
		NextHeader: proto, HopLimit: h.TTL, Src: h.Src, Dst: h.Dst,
	}); err != nil {
		return nil, err
	}
	if h.DstPort != 0 {
		if err := SetUDPChecksum(full[IPv6HeaderLen:], h.Src, h.Dst); err != nil {
			return nil, err
		}
	}
	return full, nil
}
