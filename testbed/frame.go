package testbed

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"
)

// Class says what a captured frame carries.
type Class uint8

// Classes of frames.
const (
	// ClassOther is anything not listed below: on a transit link it is
	// traffic in clear.
	ClassOther Class = iota
	// ClassESP is IP protocol 50.
	ClassESP
	// ClassESPInUDP is ESP in UDP (RFC 3948): UDP port 4500, non-zero SPI.
	ClassESPInUDP
	// ClassIKE is UDP port 500, or port 4500 with the non-ESP marker.
	ClassIKE
	// ClassKeepalive is a NAT-keepalive: UDP port 4500, the one byte 0xFF.
	ClassKeepalive
	// ClassLink is link housekeeping: ARP, IPv6 neighbour and router
	// discovery, MLD.
	ClassLink
	numClasses
)

var classNames = [numClasses]string{"other", "esp", "esp-in-udp", "ike", "nat-keepalive", "link"}

// String names the class.
func (c Class) String() string {
	if c < numClasses {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// EncapPort is the ESP-in-UDP port of RFC 3948; IKEPort that of IKE.
const (
	EncapPort = 4500
	IKEPort   = 500
)

// Ethernet types.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeARP  = 0x0806
	EtherTypeIPv6 = 0x86DD
)

// Frame is one captured frame, parsed.
type Frame struct {
	// Time is when the kernel passed the frame to the capture (its time
	// stamp, on the wall clock).
	Time time.Time
	// Outgoing is true for frames the namespace sent, false for those it
	// received.
	Outgoing bool
	// EtherType is the link-layer protocol.
	EtherType uint16
	// Len is the frame's length without the link-layer header; Data holds
	// up to the capture's snaplen of it, starting at the network header.
	// With segmentation offloads (veth, TSO/GSO) one frame can be a
	// super-packet of up to 64 KiB that the wire would carry as several.
	Len  int
	Data []byte

	Class Class
	// For IP packets: the outer addresses, the upper-layer protocol (after
	// IPv6 extension headers) and, for TCP and UDP, the ports; for ICMP and
	// ICMPv6, SrcPort is the type and DstPort the code (as XFRM selectors
	// have it).
	Src, Dst         netip.Addr
	Proto            uint8
	SrcPort, DstPort uint16
	// For ESP (raw or in UDP): the SPI and the low sequence number.
	SPI, Seq uint32
	// Fragment is set for IP fragments; FirstFragment for the one at
	// offset 0. FragID identifies the datagram (IPv4 ID or IPv6 fragment
	// identification).
	Fragment, FirstFragment bool
	FragID                  uint32
	// payloadOff is where the upper-layer header starts in the data.
	payloadOff int
}

// IP returns the IP packet (all of Data, the capture having no link-layer
// header); it is what Node.InjectIP sends again.
func (f *Frame) IP() []byte { return f.Data }

// ESP returns the ESP packet (header, payload and ICV) inside the frame,
// raw or UDP-encapsulated, or nil.
func (f *Frame) ESP() []byte {
	switch f.Class {
	case ClassESP:
		if !f.Fragment && f.payloadOff <= len(f.Data) {
			return f.Data[f.payloadOff:]
		}
	case ClassESPInUDP:
		if !f.Fragment && f.payloadOff+8 <= len(f.Data) {
			return f.Data[f.payloadOff+8:]
		}
	}
	return nil
}

// String describes the frame in one line.
func (f *Frame) String() string {
	dir := "in"
	if f.Outgoing {
		dir = "out"
	}
	s := fmt.Sprintf("%s %s len %d ethertype 0x%04x", dir, f.Class, f.Len, f.EtherType)
	if f.Src.IsValid() {
		s += fmt.Sprintf(" %v > %v proto %d", f.Src, f.Dst, f.Proto)
	}
	switch {
	case f.Proto == 1 || f.Proto == 58:
		s += fmt.Sprintf(" icmp type %d code %d", f.SrcPort, f.DstPort)
	case f.SrcPort != 0 || f.DstPort != 0:
		s += fmt.Sprintf(" ports %d > %d", f.SrcPort, f.DstPort)
	}
	if f.Class == ClassESP || f.Class == ClassESPInUDP {
		s += fmt.Sprintf(" spi 0x%08x seq %d", f.SPI, f.Seq)
	}
	if f.Fragment {
		s += fmt.Sprintf(" fragment id %d first %v", f.FragID, f.FirstFragment)
	}
	return s
}

// parse fills in the fields from the packet and classifies it. Non-first
// fragments get their class from their first fragment in
// classifyFragments.
func (f *Frame) parse(p []byte) {
	f.Class = ClassOther
	switch f.EtherType {
	case EtherTypeARP:
		f.Class = ClassLink
		return
	case EtherTypeIPv4:
		f.parseIPv4(p)
	case EtherTypeIPv6:
		f.parseIPv6(p)
	}
}

func (f *Frame) parseIPv4(p []byte) {
	if len(p) < 20 || p[0]>>4 != 4 {
		return
	}
	ihl := int(p[0]&0x0f) * 4
	if ihl < 20 || len(p) < ihl {
		return
	}
	f.Src = netip.AddrFrom4([4]byte(p[12:16]))
	f.Dst = netip.AddrFrom4([4]byte(p[16:20]))
	f.Proto = p[9]
	fo := binary.BigEndian.Uint16(p[6:8])
	if fo&0x3fff != 0 {
		f.Fragment = true
		f.FirstFragment = fo&0x1fff == 0
		f.FragID = uint32(binary.BigEndian.Uint16(p[4:6]))
		if !f.FirstFragment {
			if f.Proto == 50 {
				f.Class = ClassESP
			}
			return
		}
	}
	f.upper(p, ihl)
}

func (f *Frame) parseIPv6(p []byte) {
	if len(p) < 40 || p[0]>>4 != 6 {
		return
	}
	f.Src = netip.AddrFrom16([16]byte(p[8:24]))
	f.Dst = netip.AddrFrom16([16]byte(p[24:40]))
	nh, off := p[6], 40
	for range 8 {
		switch nh {
		case 0, 43, 60: // hop-by-hop, routing, destination options
			if len(p) < off+8 {
				f.Proto = nh
				return
			}
			nh, off = p[off], off+(int(p[off+1])+1)*8
			continue
		case 44: // fragment
			if len(p) < off+8 {
				f.Proto = nh
				return
			}
			f.Fragment = true
			fo := binary.BigEndian.Uint16(p[off+2:])
			f.FirstFragment = fo&0xfff8 == 0
			f.FragID = binary.BigEndian.Uint32(p[off+4:])
			nh, off = p[off], off+8
			if !f.FirstFragment {
				f.Proto = nh
				if nh == 50 {
					f.Class = ClassESP
				}
				return
			}
			continue
		}
		break
	}
	f.Proto = nh
	f.upper(p, off)
}

// upper classifies by the upper-layer header at p[off:].
func (f *Frame) upper(p []byte, off int) {
	f.payloadOff = off
	if off > len(p) {
		return
	}
	l4 := p[off:]
	switch f.Proto {
	case 50:
		f.Class = ClassESP
		if len(l4) >= 8 {
			f.SPI = binary.BigEndian.Uint32(l4)
			f.Seq = binary.BigEndian.Uint32(l4[4:])
		}
	case 6:
		if len(l4) >= 4 {
			f.SrcPort = binary.BigEndian.Uint16(l4)
			f.DstPort = binary.BigEndian.Uint16(l4[2:])
		}
	case 17:
		if len(l4) < 8 {
			return
		}
		f.SrcPort = binary.BigEndian.Uint16(l4)
		f.DstPort = binary.BigEndian.Uint16(l4[2:])
		pl := l4[8:]
		switch {
		case f.SrcPort == EncapPort || f.DstPort == EncapPort:
			switch {
			case len(pl) == 1 && pl[0] == 0xff:
				f.Class = ClassKeepalive
			case len(pl) >= 4 && binary.BigEndian.Uint32(pl) == 0:
				f.Class = ClassIKE
			case len(pl) >= 8:
				f.Class = ClassESPInUDP
				f.SPI = binary.BigEndian.Uint32(pl)
				f.Seq = binary.BigEndian.Uint32(pl[4:])
			}
		case f.SrcPort == IKEPort || f.DstPort == IKEPort:
			f.Class = ClassIKE
		}
	case 1:
		if len(l4) >= 2 {
			f.SrcPort, f.DstPort = uint16(l4[0]), uint16(l4[1])
		}
	case 2: // IGMP
		f.Class = ClassLink
	case 58: // ICMPv6: router and neighbour discovery, MLD
		if len(l4) >= 2 {
			f.SrcPort, f.DstPort = uint16(l4[0]), uint16(l4[1])
		}
		if len(l4) >= 1 {
			switch t := l4[0]; {
			case t >= 133 && t <= 137, t == 130, t == 131, t == 132, t == 143:
				f.Class = ClassLink
			}
		}
	}
}

type fragKey struct {
	src, dst netip.Addr
	id       uint32
}

// classifyFragments gives non-first fragments the class of their first
// fragment, when it was captured (before them or after).
func classifyFragments(frames []Frame) {
	first := make(map[fragKey]*Frame)
	for i := range frames {
		f := &frames[i]
		if f.Fragment && f.FirstFragment {
			first[fragKey{f.Src, f.Dst, f.FragID}] = f
		}
	}
	if len(first) == 0 {
		return
	}
	for i := range frames {
		f := &frames[i]
		if f.Fragment && !f.FirstFragment && f.Class == ClassOther {
			if h, ok := first[fragKey{f.Src, f.Dst, f.FragID}]; ok {
				f.Class = h.Class
				f.SPI = h.SPI
			}
		}
	}
}

// Leaks returns the frames that show any of the inner addresses in clear:
// as the frame's IP source or destination, as a 16-byte IPv6 address
// anywhere in the frame, or as two IPv4 addresses side by side (the
// source and destination fields of an IPv4 header) anywhere in the frame.
// Encrypted payload matches these patterns by chance with a probability
// below 2^-64 per position.
func (r *CaptureResult) Leaks(inner ...netip.Addr) []Frame {
	var pats [][]byte
	var v4 []netip.Addr
	for _, a := range inner {
		if a.Is4() {
			v4 = append(v4, a)
		} else {
			b := a.As16()
			pats = append(pats, b[:])
		}
	}
	for _, a := range v4 {
		for _, b := range v4 {
			if a != b {
				x, y := a.As4(), b.As4()
				pats = append(pats, append(x[:], y[:]...))
			}
		}
	}
	var out []Frame
	for i := range r.Frames {
		f := &r.Frames[i]
		leak := false
		for _, a := range inner {
			if f.Src == a || f.Dst == a {
				leak = true
			}
		}
		for _, p := range pats {
			if !leak && bytes.Contains(f.Data, p) {
				leak = true
			}
		}
		if leak {
			out = append(out, *f)
		}
	}
	return out
}

// ParseFrame parses the IP packet p as a capture would have seen it at
// time at, sent (outgoing) or received by the namespace: for tools and
// tests that analyse frames they did not capture.
func ParseFrame(p []byte, at time.Time, outgoing bool) Frame {
	f := Frame{Time: at, Outgoing: outgoing, Len: len(p), Data: p}
	if len(p) > 0 {
		f.EtherType = EtherTypeIPv4
		if p[0]>>4 == 6 {
			f.EtherType = EtherTypeIPv6
		}
	}
	f.parse(p)
	return f
}

// Echo returns the identifier and sequence number of an ICMP or ICMPv6
// echo request or reply, whether it is a reply, and false for any other
// frame.
func (f *Frame) Echo() (id, seq uint16, reply, ok bool) {
	var req, rep uint16
	switch f.Proto {
	case 1:
		req, rep = 8, 0
	case 58:
		req, rep = 128, 129
	default:
		return 0, 0, false, false
	}
	p := f.payloadOff
	if (f.Fragment && !f.FirstFragment) || (f.SrcPort != req && f.SrcPort != rep) || p <= 0 || len(f.Data) < p+8 {
		return 0, 0, false, false
	}
	return binary.BigEndian.Uint16(f.Data[p+4:]), binary.BigEndian.Uint16(f.Data[p+6:]), f.SrcPort == rep, true
}
