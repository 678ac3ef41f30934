package esp

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/packet"
)

// transportInner returns an IPv4 or IPv6 UDP packet of n bytes between
// o's endpoints, as a host sends it to its transport-mode peer.
func transportInner(o Outer, n int) []byte {
	var p []byte
	if o.Src.Is4() {
		p = innerV4(n, 0xb9, true)
		s, d := o.Src.As4(), o.Dst.As4()
		copy(p[12:16], s[:])
		copy(p[16:20], d[:])
		binary.BigEndian.PutUint16(p[10:12], 0)
		binary.BigEndian.PutUint16(p[10:12], packet.Checksum(p[:20], 0))
		return p
	}
	p = innerV6(n, 0xb9)
	s, d := o.Src.As16(), o.Dst.As16()
	copy(p[8:24], s[:])
	copy(p[24:40], d[:])
	return p
}

// outerIPHeader returns the header fields of the outer packet b, which
// the caller has checked.
func outerIPHeader(b []byte) IPHeader {
	if b[0]>>4 == 4 {
		ip, _ := packet.ParseIPv4Header(b)
		return IPHeader{Src: ip.Src, Dst: ip.Dst, TOS: ip.TOS, TTL: ip.TTL, ID: ip.ID, DF: ip.DF}
	}
	return IPHeader{
		Src: netip.AddrFrom16([16]byte(b[8:24])), Dst: netip.AddrFrom16([16]byte(b[24:40])),
		TOS: uint8(binary.BigEndian.Uint16(b[0:2]) >> 4), TTL: b[7], FlowLabel: binary.BigEndian.Uint32(b[0:4]) & 0xfffff,
	}
}

// transportFrame writes the header a sender puts in front of a
// transport-mode ESP packet and returns where the outer packet starts.
func transportFrame(out []byte, p TransportPacket, o Outer) int {
	h := packet.TunnelHeader{
		Src: o.Src, Dst: o.Dst, SrcPort: o.SrcPort, DstPort: o.DstPort, Protocol: packet.ProtoESP,
		TOS: p.TOS, TTL: p.TTL, DF: p.DF, ID: p.ID, FlowLabel: p.FlowLabel,
	}
	full, err := packet.PutTunnelHeader(out[:cap(out)], p.ESP, p.End, h)
	if err != nil {
		panic(err)
	}
	return p.End - len(full)
}

// TestTransportRoundTrip: what EncapsulateTransport seals, OpenTransport
// gives back bit for bit, header fields included, for every suite family,
// both families and both framings; a tampered packet fails, and the
// header fields the sender writes are the packet's own.
func TestTransportRoundTrip(t *testing.T) {
	for _, name := range []string{"aes128gcm16", "chacha20poly1305-esn", "aes256-sha256", "null-sha256"} {
		s, err := crypto.ParseSuite(name)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := crypto.New(s, testKey(name+"e", s.EncKeyLen()), testKey(name+"i", s.IntegKeyLen()))
		if err != nil {
			t.Fatal(err)
		}
		for _, oc := range outers() {
			t.Run(name+"/"+oc.name, func(t *testing.T) {
				e := &Encapsulator{SPI: 0x7001, Transform: tr, Outer: oc.o, TFCPadTo: 1000}
				in := transportInner(oc.o, 333)
				buf, off := place(in, MaxTrailer)
				seq := uint64(77)
				if s.ESN {
					seq |= 5 << 32
				}
				p, err := e.EncapsulateTransport(buf, off, len(in), seq)
				if err != nil {
					t.Fatal(err)
				}
				if p.Src != oc.o.Src || p.Dst != oc.o.Dst || p.TOS != 0xb9 || p.TTL != 9 {
					t.Errorf("header fields %+v", p.IPHeader)
				}
				if oc.o.Src.Is4() && (p.ID != 7 || !p.DF) {
					t.Errorf("IPv4 ID %d DF %v, want 7 and set", p.ID, p.DF)
				}
				if oc.o.Src.Is6() && p.FlowLabel != 0x12345 {
					t.Errorf("flow label %#x", p.FlowLabel)
				}
				hl := packet.IPv4HeaderLen
				if oc.o.Src.Is6() {
					hl = packet.IPv6HeaderLen
				}
				// No TFC padding: exactly the payload, padding and ICV.
				plain := len(in) - hl + 2
				plain += padLen(len(in)-hl, tr.BlockSize())
				if got, want := p.End-p.ESP, HeaderLen+tr.IVSize()+plain+tr.ICVSize(); got != want {
					t.Errorf("ESP packet of %d bytes, want %d (TFC padding in transport mode?)", got, want)
				}
				espPkt := append([]byte(nil), buf[:cap(buf)][p.ESP:p.End]...)

				d := &Decapsulator{Transform: tr, Replay: NewReplayWindow(64, s.ESN)}
				if s.ESN {
					d.Replay.Update(seq - 1)
				}
				rbuf := make([]byte, 32+len(espPkt))
				copy(rbuf[32:], espPkt)
				got, gseq, err := d.OpenTransport(rbuf, 32, len(rbuf), p.IPHeader)
				if err != nil {
					t.Fatal(err)
				}
				if gseq != seq || !bytes.Equal(got, in) {
					t.Errorf("seq %#x, packet\n got % x\nwant % x", gseq, got, in)
				}

				copy(rbuf[32:], espPkt)
				rbuf[len(rbuf)-1] ^= 1
				if _, _, err := d.OpenTransport(rbuf, 32, len(rbuf), p.IPHeader); !errors.Is(err, crypto.ErrAuthentication) {
					t.Errorf("tampered: %v", err)
				}
			})
		}
	}
}

// TestTransportRefuses: fragments, IPv4 options, IPv6 extension headers in
// front of the payload and addresses other than the SA's are refused, with
// the buffer untouched; a tunnel-mode packet or a dummy does not open as
// a transport-mode packet.
func TestTransportRefuses(t *testing.T) {
	s, _ := crypto.ParseSuite("aes128gcm16")
	tr, err := crypto.New(s, testKey("r", s.EncKeyLen()), nil)
	if err != nil {
		t.Fatal(err)
	}
	o4, o6 := outers()[0].o, outers()[2].o
	mod := func(o Outer, f func([]byte)) []byte {
		p := transportInner(o, 200)
		f(p)
		if o.Src.Is4() {
			binary.BigEndian.PutUint16(p[10:12], 0)
			binary.BigEndian.PutUint16(p[10:12], packet.Checksum(p[:int(p[0]&0x0f)*4], 0))
		}
		return p
	}
	cases := []struct {
		name string
		o    Outer
		pkt  []byte
		want error
	}{
		{"ipv4 more fragments", o4, mod(o4, func(p []byte) { p[6] |= 0x20 }), ErrTransport},
		{"ipv4 fragment offset", o4, mod(o4, func(p []byte) { p[7] = 1 }), ErrTransport},
		{"ipv4 options", o4, mod(o4, func(p []byte) { p[0] = 0x46 }), ErrTransport},
		{"ipv4 other source", o4, mod(o4, func(p []byte) { p[15]++ }), ErrTransport},
		{"ipv4 other destination", o4, mod(o4, func(p []byte) { p[19]++ }), ErrTransport},
		{"ipv4 bad checksum", o4, func() []byte { p := transportInner(o4, 200); p[10]++; return p }(), ErrInner},
		{"ipv4 length past the data", o4, func() []byte { p := mod(o4, func(p []byte) { p[3] += 8 }); return p }(), ErrInner},
		{"ipv6 hop-by-hop", o6, mod(o6, func(p []byte) { p[6] = packet.ProtoHopByHop }), ErrTransport},
		{"ipv6 fragment header", o6, mod(o6, func(p []byte) { p[6] = packet.ProtoFragment }), ErrTransport},
		{"ipv6 routing header", o6, mod(o6, func(p []byte) { p[6] = packet.ProtoRouting }), ErrTransport},
		{"ipv6 other destination", o6, mod(o6, func(p []byte) { p[39]++ }), ErrTransport},
		{"ipv6 length past the data", o6, mod(o6, func(p []byte) { p[5]++ }), ErrInner},
	}
	for _, c := range cases {
		e := &Encapsulator{SPI: 1, Transform: tr, Outer: c.o}
		buf, off := place(c.pkt, MaxTrailer)
		before := append([]byte(nil), buf[:cap(buf)]...)
		if _, err := e.EncapsulateTransport(buf, off, len(c.pkt), 1); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if !bytes.Equal(before, buf[:cap(buf)]) {
			t.Errorf("%s: buffer changed", c.name)
		}
	}

	// A tunnel-mode packet (Next Header 4) and a dummy (59) are not
	// transport-mode packets.
	e := &Encapsulator{SPI: 1, Transform: tr, Outer: o4}
	d := &Decapsulator{Transform: tr}
	h := IPHeader{Src: o4.Src, Dst: o4.Dst, TTL: 64}
	in := innerV4(100, 0, false)
	buf, off := place(in, MaxTrailer)
	p, err := e.Encapsulate(buf, off, len(in), 9)
	if err != nil {
		t.Fatal(err)
	}
	rbuf := append(make([]byte, 32), buf[:cap(buf)][p.ESP:p.End]...)
	if _, _, err := d.OpenTransport(rbuf, 32, len(rbuf), h); !errors.Is(err, ErrNextHeader) {
		t.Errorf("tunnel-mode packet: %v, want ErrNextHeader", err)
	}
	buf, off = place(in, MaxTrailer)
	p, err = e.EncapsulateDummy(buf, off, 40, 10)
	if err != nil {
		t.Fatal(err)
	}
	rbuf = append(make([]byte, 32), buf[:cap(buf)][p.ESP:p.End]...)
	if _, _, err := d.OpenTransport(rbuf, 32, len(rbuf), h); !errors.Is(err, ErrDummy) {
		t.Errorf("dummy: %v, want ErrDummy", err)
	}
}

// TestScapyTransport checks transport mode against scapy's ESP code in
// both directions, as TestScapyInterop does tunnel mode: scapy decrypts
// what EncapsulateTransport sealed back into the original packet, and
// OpenTransport opens what scapy encrypted in transport mode.
func TestScapyTransport(t *testing.T) {
	needScapy(t)
	type meta struct {
		name string
		tr   crypto.Transform
		o    Outer
		in   []byte
		sseq uint64
	}
	var cases []scapyCase
	var metas []meta
	for _, name := range []string{"aes128gcm16", "chacha20poly1305", "aes256-sha256", "aes128-sha1"} {
		s, err := crypto.ParseSuite(name)
		if err != nil {
			t.Fatal(err)
		}
		ck, ak := testKey(name+"tenc", s.EncKeyLen()), testKey(name+"tinteg", s.IntegKeyLen())
		tr, err := crypto.New(s, ck, ak)
		if err != nil {
			t.Fatal(err)
		}
		crypt, auth := scapyAlgos(s)
		for i, oc := range outers() {
			if oc.o.DstPort != 0 {
				continue // scapy's NAT-T framing is checked in tunnel mode
			}
			e := &Encapsulator{SPI: 0xc2000000 | uint32(i), Transform: tr, Outer: oc.o}
			in := transportInner(oc.o, 150+i*41)
			buf, off := place(in, MaxTrailer)
			seq := uint64(300 + i)
			p, err := e.EncapsulateTransport(buf, off, len(in), seq)
			if err != nil {
				t.Fatal(err)
			}
			out := buf[:cap(buf)]
			cases = append(cases, scapyCase{
				Crypt: crypt, Auth: auth, CKey: hex.EncodeToString(ck), AKey: hex.EncodeToString(ak),
				SPI: e.SPI, Src: oc.o.Src.String(), Dst: oc.o.Dst.String(), Transport: true,
				Decrypt: hex.EncodeToString(out[transportFrame(out, p, oc.o):p.End]),
				Inner:   hex.EncodeToString(in), Seq: uint32(seq + 1),
			})
			metas = append(metas, meta{name: fmt.Sprintf("%s/%s", name, oc.name), tr: tr, o: oc.o, in: in, sseq: seq + 1})
		}
	}
	for i, r := range runScapy(t, cases) {
		m := metas[i]
		enc, espPkt, ok := checkScapy(t, m.name, r, m.in, m.o)
		if !ok {
			continue
		}
		h := outerIPHeader(enc)
		d := &Decapsulator{Transform: m.tr, Replay: NewReplayWindow(64, false)}
		rbuf := append(make([]byte, 32), espPkt...)
		got, seq, err := d.OpenTransport(rbuf, 32, len(rbuf), h)
		if err != nil {
			t.Errorf("%s: opening scapy's packet: %v", m.name, err)
			continue
		}
		if seq != m.sseq || !bytes.Equal(got, m.in) {
			t.Errorf("%s: seq %d (want %d)\n got % x\nwant % x", m.name, seq, m.sseq, got, m.in)
		}
	}
	t.Logf("%d cases, each direction", len(cases))
}

// natPacket returns an IP packet from src to dst carrying a TCP segment
// or UDP datagram (proto) of n payload bytes, its checksum computed over
// src and dst (0 for an IPv4 UDP datagram without one, when noSum).
func natPacket(src, dst netip.Addr, proto uint8, n int, noSum bool) []byte {
	l4len := 20 + n
	if proto == packet.ProtoUDP {
		l4len = packet.UDPHeaderLen + n
	}
	hl := packet.IPv4HeaderLen
	if src.Is6() {
		hl = packet.IPv6HeaderLen
	}
	p := make([]byte, hl+l4len)
	if src.Is4() {
		packet.PutIPv4Header(p, packet.IPv4Header{TotalLen: uint16(len(p)), TTL: 64, Protocol: proto, Src: src, Dst: dst})
	} else {
		packet.PutIPv6Header(p, packet.IPv6Header{PayloadLen: uint16(l4len), NextHeader: proto, HopLimit: 64, Src: src, Dst: dst})
	}
	l4 := p[hl:]
	for i := range l4 {
		l4[i] = byte(i*7 + 3)
	}
	binary.BigEndian.PutUint16(l4[0:2], 1701)
	binary.BigEndian.PutUint16(l4[2:4], 1701)
	if proto == packet.ProtoUDP {
		binary.BigEndian.PutUint16(l4[4:6], uint16(l4len))
		l4[6], l4[7] = 0, 0
		if !noSum {
			packet.SetUDPChecksum(l4, src, dst)
		}
	} else {
		l4[12] = 5 << 4
		packet.SetTCPChecksum(l4, src, dst)
	}
	return p
}

// l4Valid reports whether the TCP or UDP checksum of pkt verifies over
// its own addresses (an IPv4 UDP checksum of 0: none, valid).
func l4Valid(pkt []byte, src, dst netip.Addr, proto uint8) bool {
	hl := packet.IPv4HeaderLen
	if src.Is6() {
		hl = packet.IPv6HeaderLen
	}
	l4 := pkt[hl:]
	if proto == packet.ProtoUDP && src.Is4() && l4[6]|l4[7] == 0 {
		return true
	}
	return packet.Checksum(l4, packet.PseudoHeaderSum(proto, src, dst, len(l4))) == 0
}

// TestTransportNAT: behind a NAT (RFC 3948 section 3.1.2) the sender's
// TCP and UDP checksums cover its private address; a UDP-encapsulated
// state's OpenTransport delivers them valid over the addresses it writes,
// a raw ESP state's leaves them as they came, and an IPv4 UDP datagram
// without a checksum keeps none.
func TestTransportNAT(t *testing.T) {
	s, _ := crypto.ParseSuite("aes128gcm16")
	tr, err := crypto.New(s, testKey("nat", s.EncKeyLen()), nil)
	if err != nil {
		t.Fatal(err)
	}
	type fam struct{ private, public, server netip.Addr }
	fams := []fam{
		{netip.MustParseAddr("198.18.7.10"), netip.MustParseAddr("198.19.0.7"), netip.MustParseAddr("198.19.0.1")},
		{netip.MustParseAddr("2001:db8:7::10"), netip.MustParseAddr("2001:db8:ff::7"), netip.MustParseAddr("2001:db8:ff::1")},
	}
	for _, f := range fams {
		for _, c := range []struct {
			name  string
			proto uint8
			noSum bool
		}{{"tcp", packet.ProtoTCP, false}, {"udp", packet.ProtoUDP, false}, {"udp no checksum", packet.ProtoUDP, true}} {
			if c.noSum && f.private.Is6() {
				continue
			}
			for _, encap := range []bool{true, false} {
				name := fmt.Sprintf("%v/%s/encap=%v", f.private, c.name, encap)
				// The client seals with its own view of the addresses.
				e := &Encapsulator{SPI: 0x7002, Transform: tr, Outer: Outer{Src: f.private, Dst: f.server, SrcPort: 4500, DstPort: 4500}}
				in := natPacket(f.private, f.server, c.proto, 301, c.noSum)
				if !l4Valid(in, f.private, f.server, c.proto) {
					t.Fatalf("%s: test packet's checksum is wrong", name)
				}
				buf, off := place(in, MaxTrailer)
				p, err := e.EncapsulateTransport(buf, off, len(in), 3)
				if err != nil {
					t.Fatal(err)
				}
				// The server sees the NAT's public address.
				h := p.IPHeader
				h.Src = f.public
				d := &Decapsulator{Transform: tr, UDPEncap: encap}
				rbuf := append(make([]byte, 32), buf[:cap(buf)][p.ESP:p.End]...)
				got, _, err := d.OpenTransport(rbuf, 32, len(rbuf), h)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				valid := l4Valid(got, f.public, f.server, c.proto)
				switch {
				case c.noSum:
					if l4 := got[packet.IPv4HeaderLen:]; l4[6]|l4[7] != 0 {
						t.Errorf("%s: a UDP datagram without a checksum got one", name)
					}
				case encap && !valid:
					t.Errorf("%s: checksum not valid over the delivered addresses", name)
				case !encap && valid:
					t.Errorf("%s: raw ESP state rewrote the checksum", name)
				}
			}
		}
	}
}
