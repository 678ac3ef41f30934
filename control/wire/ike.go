package wire

import "net/netip"

// IKE hand-off attributes (docs/control-protocol.md, section 9).
const (
	// AttrIKEPorts is a pair: in IKE_PACKET the datagram's source and
	// destination UDP ports; in the IKE_REGISTER reply the IKE port and
	// the NAT-T (ESP-in-UDP) port espd serves.
	AttrIKEPorts AttrType = 80
	// AttrIKEData is the UDP payload as on the wire: on the NAT-T port
	// with its non-ESP marker.
	AttrIKEData AttrType = 81
)

// PutIKEPorts appends the attributes of an IKE_REGISTER reply: the IKE
// port and the NAT-T port.
func PutIKEPorts(b *Builder, ike, natt uint16) {
	b.U16Pair(AttrIKEPorts, ike, natt)
}

// ReadIKEPorts reads an IKE_REGISTER reply.
func ReadIKEPorts(attrs []Attr) (ike, natt uint16, err error) {
	r := newReader(attrs)
	ike, natt, ok := r.pair(AttrIKEPorts)
	r.require(AttrIKEPorts, ok)
	return ike, natt, r.error()
}

// PutIKEPacket appends an IKE_PACKET's attributes: a datagram from src to
// dst with the UDP payload data. An invalid src address is left out.
func PutIKEPacket(b *Builder, src, dst netip.AddrPort, data []byte) {
	if src.Addr().IsValid() {
		b.Addr(AttrSrc, src.Addr().Unmap())
	}
	b.Addr(AttrDst, dst.Addr().Unmap())
	b.U16Pair(AttrIKEPorts, src.Port(), dst.Port())
	b.Raw(AttrIKEData, data)
}

// ReadIKEPacket reads an IKE_PACKET's attributes: DST, IKE_PORTS and
// IKE_DATA are required, SRC is optional (without it src has an invalid
// address and the source port). data is a copy: it does not alias attrs.
func ReadIKEPacket(attrs []Attr) (src, dst netip.AddrPort, data []byte, err error) {
	rd := newReader(attrs)
	srcAddr, hasSrc := rd.addr(AttrSrc)
	dstAddr, hasDst := rd.addr(AttrDst)
	sport, dport, hasPorts := rd.pair(AttrIKEPorts)
	data, hasData := rd.bytes(AttrIKEData)
	rd.require(AttrDst, hasDst)
	rd.require(AttrIKEPorts, hasPorts)
	rd.require(AttrIKEData, hasData)
	if err := rd.error(); err != nil {
		return netip.AddrPort{}, netip.AddrPort{}, nil, err
	}
	if hasSrc && srcAddr.Is4() != dstAddr.Is4() {
		return netip.AddrPort{}, netip.AddrPort{}, nil, &Error{Code: EINVAL, Msg: "SRC and DST of an IKE packet must be of one family", Attr: AttrSrc}
	}
	if dport == 0 {
		return netip.AddrPort{}, netip.AddrPort{}, nil, &Error{Code: EINVAL, Msg: "IKE packet to port 0", Attr: AttrIKEPorts}
	}
	return netip.AddrPortFrom(srcAddr, sport), netip.AddrPortFrom(dstAddr, dport), data, nil
}
