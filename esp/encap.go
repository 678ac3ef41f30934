package esp

import (
	"encoding/binary"
	"net/netip"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/packet"
)

// DFMode says how the outer IPv4 header's Don't Fragment bit is set.
type DFMode uint8

// DF modes, as XFRM's XFRM_STATE_NOPMTUDISC and the Linux df_bit sysctl
// variants: copy it from the inner packet (an IPv6 inner packet counts as
// DF set, since IPv6 is never fragmented on the path), always set it, or
// always clear it.
const (
	DFCopy DFMode = iota
	DFSet
	DFClear
)

// String returns "copy", "set" or "clear".
func (m DFMode) String() string {
	switch m {
	case DFCopy:
		return "copy"
	case DFSet:
		return "set"
	case DFClear:
		return "clear"
	}
	return "DFMode(?)"
}

// defaultTTL is the outer TTL or hop limit when Outer.TTL is 0.
const defaultTTL = 64

// Outer describes the outer (tunnel) header an Encapsulator writes.
type Outer struct {
	Src, Dst         netip.Addr // tunnel endpoints, both IPv4 or both IPv6
	SrcPort, DstPort uint16     // DstPort != 0: ESP-in-UDP (RFC 3948)
	TTL              uint8      // TTL or hop limit; 0: 64
	CopyDSCP         bool       // copy the inner DSCP; else write DSCP
	DSCP             uint8      // DSCP when CopyDSCP is false (0 to 63)
	ECN              bool       // true: RFC 6040 normal mode; false: compatibility mode
	DF               DFMode     // IPv4 outer only
}

// Encapsulator builds the ESP packets of one outbound SA. Its fields are
// set once and read concurrently by many workers; Transform must be set.
type Encapsulator struct {
	SPI       uint32
	Transform crypto.Transform
	Outer     Outer
	// TFCPadTo pads inner packets shorter than this many bytes with zeros
	// (Traffic Flow Confidentiality padding, RFC 4303 section 2.4) as far
	// as the buffer's capacity allows; 0 turns it off. Keep it at most
	// InnerMTU of the path MTU, or padded packets will exceed the MTU.
	TFCPadTo int
}

// Packet locates an encapsulated packet in its buffer, buf[ESP:End] from
// the SPI to the ICV, and gives the outer header fields that follow the
// inner packet: the outer TOS (DSCP and ECN) and the IPv4 DF bit. The
// outer header itself is the sender's to write (package conn), in the
// headroom that Encapsulate leaves in front of ESP.
type Packet struct {
	ESP, End int
	TOS      uint8
	DF       bool
}

// outerLen returns the bytes of outer IP and UDP header, and whether the
// outer header is IPv4.
func (e *Encapsulator) outerLen() (int, bool, error) {
	o := &e.Outer
	var n int
	var v4 bool
	switch {
	case o.Src.Is4() && o.Dst.Is4():
		n, v4 = packet.IPv4HeaderLen, true
	case o.Src.Is6() && o.Dst.Is6() && !o.Src.Is4In6() && !o.Dst.Is4In6():
		n = packet.IPv6HeaderLen
	default:
		return 0, false, ErrOuter
	}
	if o.DstPort != 0 {
		n += packet.UDPHeaderLen
	}
	return n, v4, nil
}

// fixedOverhead returns the overhead that does not depend on the length:
// outer headers, ESP header, IV and ICV. It is 0 for a bad Outer.
func (e *Encapsulator) fixedOverhead() int {
	n, _, _ := e.outerLen()
	if n == 0 {
		return 0
	}
	return n + HeaderLen + e.Transform.IVSize() + e.Transform.ICVSize()
}

// padLen returns the RFC 4303 padding for a payload of p bytes.
func padLen(p, bs int) int {
	return (bs - (p+2)%bs) % bs
}

// InnerMTU returns the largest inner packet whose encapsulation fits in
// outerMTU bytes, or 0 if none does.
func (e *Encapsulator) InnerMTU(outerMTU int) int {
	f := e.fixedOverhead()
	bs := e.Transform.BlockSize()
	avail := min(outerMTU, 0xffff) - f
	if f == 0 || avail < bs {
		return 0
	}
	return avail/bs*bs - 2
}

// Encapsulate turns the inner IPv4 or IPv6 packet buf[off:off+n] into an
// ESP tunnel-mode packet with sequence number seq (its low 32 bits go on
// the wire; with ESN the high bits are authenticated), in place: the ESP
// header and the IV go in front of off, and the TFC padding, ESP padding,
// Pad Length, Next Header and ICV behind the inner packet, up to cap(buf).
// In front of the ESP header it leaves room for the outer IP header (and
// UDP header when Outer.DstPort != 0), which it does not write: it
// returns the fields of that header that follow the inner packet.
//
// The outer header then carries: TTL or hop limit Outer.TTL (0: 64); the
// inner DSCP or Outer.DSCP; the inner ECN field in RFC 6040 normal mode
// (Outer.ECN) or Not-ECT in compatibility mode; for IPv4, DF per Outer.DF.
//
// It returns ErrInner for an inner packet that is not IPv4 or IPv6 or is
// shorter than its header or its length field, ErrHeadroom when off is
// less than the framing needs, ErrTailroom when the capacity cannot hold
// the trailer, ErrTooBig past 65535 bytes and ErrOuter for a bad Outer.
// On error buf is unchanged.
func (e *Encapsulator) Encapsulate(buf []byte, off, n int, seq uint64) (Packet, error) {
	if off < 0 || n < 1 || off > cap(buf)-n {
		return Packet{}, ErrInner
	}
	full := buf[:cap(buf)]
	inner := full[off : off+n]
	var nh uint8
	switch inner[0] >> 4 {
	case 4:
		if n < packet.IPv4HeaderLen {
			return Packet{}, ErrInner
		}
		tl := int(binary.BigEndian.Uint16(inner[2:4]))
		if tl > n || tl < int(inner[0]&0x0f)*4 || tl < packet.IPv4HeaderLen {
			return Packet{}, ErrInner
		}
		nh = NextHeaderIPv4
	case 6:
		if n < packet.IPv6HeaderLen || packet.IPv6HeaderLen+int(binary.BigEndian.Uint16(inner[4:6])) > n {
			return Packet{}, ErrInner
		}
		nh = NextHeaderIPv6
	default:
		return Packet{}, ErrInner
	}
	return e.encapsulate(full, off, n, seq, nh, false)
}

// encapsulate seals full[off:off+n] with next header nh. In transport
// mode the payload is an upper-layer packet: no TFC padding (its length
// is not always in it, RFC 4303 section 2.4) and no outer fields from it.
func (e *Encapsulator) encapsulate(full []byte, off, n int, seq uint64, nh uint8, transport bool) (Packet, error) {
	t := e.Transform
	ol, _, err := e.outerLen()
	if err != nil {
		return Packet{}, err
	}
	iv, icv, bs := t.IVSize(), t.ICVSize(), t.BlockSize()
	espOff := off - iv - HeaderLen
	start := espOff - ol
	if start < 0 {
		return Packet{}, ErrHeadroom
	}
	// The largest plaintext the capacity and the IP length allow.
	maxPlain := min(len(full)-off-icv, 0xffff-(off-start)-icv) / bs * bs
	if n+2 > maxPlain {
		if off-start+n+2+icv > 0xffff {
			return Packet{}, ErrTooBig
		}
		return Packet{}, ErrTailroom
	}
	if nh == NextHeaderDummy {
		clear(full[off : off+n])
	}
	p := n
	if e.TFCPadTo > n && !transport {
		p = min(e.TFCPadTo, maxPlain-2)
	}
	pl := padLen(p, bs)
	end := off + p + pl + 2 + icv

	// Trailer: TFC padding, padding 1, 2, 3, ..., Pad Length, Next Header.
	tr := full[off+n : end-icv]
	clear(tr[:p-n])
	for i := range pl {
		tr[p-n+i] = byte(i + 1)
	}
	tr[len(tr)-2] = byte(pl)
	tr[len(tr)-1] = nh

	// Outer fields come from the inner header, before it is encrypted.
	var tos uint8
	var df bool
	if !transport {
		tos, df = e.outerTOS(full[off:off+n], nh)
	}

	// ESP header, then Seal writes the IV and the ICV.
	binary.BigEndian.PutUint32(full[espOff:], e.SPI)
	binary.BigEndian.PutUint32(full[espOff+4:], uint32(seq))
	t.Seal(full[espOff:end], seq)

	return Packet{ESP: espOff, End: end, TOS: tos, DF: df}, nil
}

// TTLOrDefault returns the outer TTL or hop limit: Outer.TTL, or 64
// when it is 0.
func (o *Outer) TTLOrDefault() uint8 {
	if o.TTL == 0 {
		return defaultTTL
	}
	return o.TTL
}

// outerTOS returns the outer TOS (DSCP and ECN) and DF bit for the inner
// packet inner with next header nh.
func (e *Encapsulator) outerTOS(inner []byte, nh uint8) (uint8, bool) {
	o := &e.Outer
	var itos uint8
	idf := true // IPv6 and dummy packets: DF in copy mode
	switch nh {
	case NextHeaderIPv4:
		itos = inner[1]
		idf = binary.BigEndian.Uint16(inner[6:8])&packet.IPv4DontFragment != 0
	case NextHeaderIPv6:
		itos = uint8(binary.BigEndian.Uint16(inner[0:2]) >> 4)
	}
	dscp := o.DSCP << 2
	if o.CopyDSCP {
		dscp = itos &^ packet.ECNMask
	}
	var ecn uint8 // compatibility mode: Not-ECT
	if o.ECN {
		ecn = itos & packet.ECNMask // normal mode: copy, CE included
	}
	df := idf
	switch o.DF {
	case DFSet:
		df = true
	case DFClear:
		df = false
	}
	return dscp | ecn, df
}
