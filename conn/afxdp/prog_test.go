package afxdp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/espd/espd/packet"
)

// frame builds an Ethernet frame carrying an outer IPv4 or IPv6 packet
// from src to dst with protocol proto and payload l4.
func frame(t testing.TB, src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	t.Helper()
	f := make([]byte, ethLen, 1600)
	copy(f[0:6], []byte{2, 0, 0, 0, 0, 2})
	copy(f[6:12], []byte{2, 0, 0, 0, 0, 1})
	if dst.Is4() {
		binary.BigEndian.PutUint16(f[12:], 0x0800)
		ip := make([]byte, packet.IPv4HeaderLen)
		ip[0], ip[1] = 0x45, 0xb8
		binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)+len(l4)))
		ip[6], ip[8], ip[9] = 0x40, 64, proto
		s, d := src.As4(), dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		binary.BigEndian.PutUint16(ip[10:], packet.Checksum(ip, 0))
		f = append(f, ip...)
	} else {
		binary.BigEndian.PutUint16(f[12:], 0x86dd)
		ip := make([]byte, packet.IPv6HeaderLen)
		ip[0], ip[1] = 0x6b, 0x80 // traffic class 0xb8
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6], ip[7] = proto, 64
		s, d := src.As16(), dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		f = append(f, ip...)
	}
	return append(f, l4...)
}

func espPayload(spi uint32, n int) []byte {
	b := make([]byte, n)
	binary.BigEndian.PutUint32(b, spi)
	binary.BigEndian.PutUint32(b[4:], 1)
	for i := 8; i < n; i++ {
		b[i] = byte(i)
	}
	return b
}

func udpPayload(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, packet.UDPHeaderLen, packet.UDPHeaderLen+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(packet.UDPHeaderLen+len(payload)))
	return append(b, payload...)
}

var (
	peer4 = netip.MustParseAddr("198.18.0.1")
	self4 = netip.MustParseAddr("198.18.0.2")
	peer6 = netip.MustParseAddr("2001:db8::1")
	self6 = netip.MustParseAddr("2001:db8::2")
)

// TestProgram runs the XDP program on frames (BPF_PROG_TEST_RUN): only
// unfragmented ESP, and non-IKE UDP to the encapsulation port, of a
// state in the map, to its destination, is redirected.
func TestProgram(t *testing.T) {
	needRoot(t)
	p := &Path{inMap: map[[4]byte][stateValueLen]byte{}}
	var err error
	p.states, err = ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: stateValueLen, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	xsks, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer xsks.Close()
	if err := p.SetStates([]State{{SPI: 0x1001, Dst: self4, Src: peer4}, {SPI: 0x1002, Dst: self6, Src: peer6},
		{SPI: 0x1004, Dst: self4}}); err != nil {
		t.Fatal(err)
	}
	other4, other6 := netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("2001:db8:1::1")
	// The test run has no socket in xsks: a frame the program redirects
	// gets the fallback action, XDP_DROP here (XDP_PASS in espd).
	const xdpDrop, redirect = 1, 1
	frag := frame(t, peer4, self4, packet.ProtoESP, espPayload(0x1001, 64))
	frag[ethLen+6] = 0x20 // MF
	binary.BigEndian.PutUint16(frag[ethLen+10:], 0)
	binary.BigEndian.PutUint16(frag[ethLen+10:], packet.Checksum(frag[ethLen:ethLen+20], 0))
	vlan := append([]byte(nil), frame(t, peer4, self4, packet.ProtoESP, espPayload(0x1001, 64))...)
	binary.BigEndian.PutUint16(vlan[12:], 0x8100)
	opts4 := frame(t, peer4, self4, packet.ProtoESP, espPayload(0x1001, 64))
	opts4[ethLen] = 0x46
	for _, encap := range []uint16{0, 4500} {
		prog, err := loadProgram(p.states, xsks, encap, maxFrame, xdpDrop)
		if err != nil {
			t.Fatal(err)
		}
		udp := func(want uint32) uint32 {
			if encap == 0 {
				return xdpPass
			}
			return want
		}
		cases := []struct {
			name string
			f    []byte
			want uint32
		}{
			{"esp4", frame(t, peer4, self4, packet.ProtoESP, espPayload(0x1001, 64)), redirect},
			{"esp6", frame(t, peer6, self6, packet.ProtoESP, espPayload(0x1002, 64)), redirect},
			{"esp4 unknown SPI", frame(t, peer4, self4, packet.ProtoESP, espPayload(0x1003, 64)), xdpPass},
			{"esp4 other destination", frame(t, peer4, netip.MustParseAddr("198.18.0.3"), packet.ProtoESP, espPayload(0x1001, 64)), xdpPass},
			{"esp6 SPI of the IPv4 state", frame(t, peer6, self6, packet.ProtoESP, espPayload(0x1001, 64)), xdpPass},
			{"esp6 other destination", frame(t, peer6, netip.MustParseAddr("2001:db8::3"), packet.ProtoESP, espPayload(0x1002, 64)), xdpPass},
			{"esp4 other source", frame(t, other4, self4, packet.ProtoESP, espPayload(0x1001, 64)), xdpPass},
			{"esp6 other source", frame(t, other6, self6, packet.ProtoESP, espPayload(0x1002, 64)), xdpPass},
			{"udp4 other source", frame(t, other4, self4, packet.ProtoUDP, udpPayload(4500, 4500, espPayload(0x1001, 64))), xdpPass},
			{"esp4 any source", frame(t, other4, self4, packet.ProtoESP, espPayload(0x1004, 64)), redirect},
			{"esp4 fragment", frag, xdpPass},
			{"esp4 with options", opts4, xdpPass},
			{"vlan", vlan, xdpPass},
			{"esp4 truncated", frame(t, peer4, self4, packet.ProtoESP, espPayload(0x1001, 64))[:ethLen+20+6], xdpPass},
			{"esp4 filling a frame", frame(t, peer4, self4, packet.ProtoESP, espPayload(0x1001, maxFrame-ethLen-20)), redirect},
			{"esp4 larger than a frame", frame(t, peer4, self4, packet.ProtoESP, espPayload(0x1001, maxFrame)), xdpPass},
			{"udp4 esp", frame(t, peer4, self4, packet.ProtoUDP, udpPayload(4500, 4500, espPayload(0x1001, 64))), udp(redirect)},
			{"udp6 esp", frame(t, peer6, self6, packet.ProtoUDP, udpPayload(4500, 4500, espPayload(0x1002, 64))), udp(redirect)},
			{"udp4 ike", frame(t, peer4, self4, packet.ProtoUDP, udpPayload(4500, 4500, make([]byte, 64))), xdpPass},
			{"udp4 keepalive", frame(t, peer4, self4, packet.ProtoUDP, udpPayload(4500, 4500, []byte{0xff})), xdpPass},
			{"udp4 other port", frame(t, peer4, self4, packet.ProtoUDP, udpPayload(4500, 4501, espPayload(0x1001, 64))), xdpPass},
			{"tcp", frame(t, peer4, self4, 6, espPayload(0x1001, 64)), xdpPass},
		}
		for _, c := range cases {
			got, err := prog.Run(&ebpf.RunOptions{Data: c.f})
			if err != nil {
				t.Fatalf("encap %d, %s: %v", encap, c.name, err)
			}
			if got != c.want {
				t.Errorf("encap %d, %s: action %d, want %d", encap, c.name, got, c.want)
			}
		}
		prog.Close()
	}
	// A state removed from the map is the kernel's again.
	if err := p.SetStates([]State{{SPI: 0x1002, Dst: self6, Src: peer6}}); err != nil {
		t.Fatal(err)
	}
	prog, err := loadProgram(p.states, xsks, 0, maxFrame, xdpDrop)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if got, _ := prog.Run(&ebpf.RunOptions{Data: frame(t, peer4, self4, packet.ProtoESP, espPayload(0x1001, 64))}); got != xdpPass {
		t.Errorf("removed state: action %d, want pass", got)
	}
}
