package packet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

// reassemble puts fragments back together, checking each one on the way.
func reassemble(t *testing.T, frags [][]byte, mtu int) (hdr []byte, payload []byte, lastMF bool) {
	t.Helper()
	payload = make([]byte, 65536)
	end := 0
	for i, f := range frags {
		h, err := ParseIPv4Header(f)
		if err != nil {
			t.Fatalf("fragment %d: %v", i, err)
		}
		if len(f) > mtu || int(h.TotalLen) != len(f) {
			t.Fatalf("fragment %d: length %d (field %d), mtu %d", i, len(f), h.TotalLen, mtu)
		}
		data := f[h.HeaderLen:]
		if i < len(frags)-1 && (!h.MF || len(data)%8 != 0) {
			t.Fatalf("fragment %d: MF %v, %d data bytes", i, h.MF, len(data))
		}
		if h.DF {
			t.Fatalf("fragment %d has DF", i)
		}
		copy(payload[h.FragOffset:], data)
		end = max(end, int(h.FragOffset)+len(data))
		if i == 0 {
			hdr = f[:h.HeaderLen]
		}
		lastMF = h.MF
	}
	return hdr, payload[:end], lastMF
}

func TestFragmentIPv4(t *testing.T) {
	opts := []byte{0x83, 7, 4, 198, 18, 0, 9, 1, 0x07, 3, 0, 0} // LSRR (copied), NOP, RR (not copied), EOL
	for _, o := range [][]byte{nil, opts} {
		for _, mtu := range []int{68, 576, 1280, 1500} {
			for _, plen := range []int{1, 47, 1000, 1480, 3001} {
				pkt := ipv4Packet("198.18.0.1", "198.19.0.1", ProtoESP, o, make([]byte, plen))
				for i := range plen {
					pkt[len(o)+20+i] = byte(i * 13)
				}
				frags := make([][]byte, 128)
				for i := range frags {
					frags[i] = make([]byte, 0, mtu)
				}
				n, err := FragmentIPv4(frags, pkt, mtu)
				if len(pkt) > mtu && (len(o)+20+8 > mtu) {
					continue // cannot fragment; covered below
				}
				if err != nil {
					t.Fatalf("opts %d mtu %d plen %d: %v", len(o), mtu, plen, err)
				}
				if len(pkt) <= mtu {
					if n != 1 || !bytes.Equal(frags[0], pkt) {
						t.Fatalf("fitting packet not copied unchanged")
					}
					continue
				}
				hdr, payload, lastMF := reassemble(t, frags[:n], mtu)
				if lastMF {
					t.Fatal("last fragment has MF")
				}
				if !bytes.Equal(payload, pkt[20+len(o):]) {
					t.Fatalf("opts %d mtu %d plen %d: reassembled payload differs", len(o), mtu, plen)
				}
				if !bytes.Equal(hdr[20:], o) || !bytes.Equal(hdr[12:20], pkt[12:20]) || hdr[9] != ProtoESP || hdr[4] != pkt[4] {
					t.Fatalf("first fragment header % x", hdr)
				}
				if n > 1 && len(o) > 0 {
					h2, _ := ParseIPv4Header(frags[1])
					if !bytes.Equal(frags[1][20:h2.HeaderLen], []byte{0x83, 7, 4, 198, 18, 0, 9, 0}) {
						t.Fatalf("later fragment options % x", frags[1][20:h2.HeaderLen])
					}
				}
			}
		}
	}
}

func TestFragmentIPv4Refragment(t *testing.T) {
	// A middle fragment (offset 800, MF) split again keeps MF on its last piece.
	pkt := ipv4Packet("198.18.0.1", "198.19.0.1", ProtoUDP, nil, make([]byte, 1000))
	binary.BigEndian.PutUint16(pkt[6:8], IPv4MoreFragments|100)
	frags := [][]byte{make([]byte, 0, 600), make([]byte, 0, 600)}
	n, err := FragmentIPv4(frags, pkt, 600)
	if err != nil || n != 2 {
		t.Fatalf("%d %v", n, err)
	}
	h0, _ := ParseIPv4Header(frags[0])
	h1, _ := ParseIPv4Header(frags[1])
	if h0.FragOffset != 800 || !h0.MF || h1.FragOffset != 800+576 || !h1.MF {
		t.Fatalf("offsets %d %d, MF %v %v", h0.FragOffset, h1.FragOffset, h0.MF, h1.MF)
	}
}

func TestFragmentIPv4Errors(t *testing.T) {
	pkt := ipv4Packet("198.18.0.1", "198.19.0.1", ProtoUDP, nil, make([]byte, 1480))
	mk := func(k, c int) [][]byte {
		f := make([][]byte, k)
		for i := range f {
			f[i] = make([]byte, 0, c)
		}
		return f
	}
	df := append([]byte(nil), pkt...)
	binary.BigEndian.PutUint16(df[6:8], IPv4DontFragment)
	if _, err := FragmentIPv4(mk(4, 1500), df, 1400); err != ErrDontFragment {
		t.Errorf("DF: %v", err)
	}
	if _, err := FragmentIPv4(mk(1, 1500), pkt, 1400); err != ErrShortBuffer {
		t.Errorf("too few buffers: %v", err)
	}
	if _, err := FragmentIPv4(mk(2, 1000), pkt, 1400); err != ErrShortBuffer {
		t.Errorf("small buffers: %v", err)
	}
	if _, err := FragmentIPv4(mk(100, 1500), pkt, 27); err != ErrMTU {
		t.Errorf("tiny mtu: %v", err)
	}
	if _, err := FragmentIPv4(mk(4, 1500), pkt[:100], 1400); err != ErrTruncated {
		t.Errorf("truncated: %v", err)
	}
	bad := ipv4Packet("198.18.0.1", "198.19.0.1", ProtoUDP, []byte{0x83, 9, 0, 0}, make([]byte, 1480))
	if _, err := FragmentIPv4(mk(4, 1500), bad, 1400); err != ErrOptions {
		t.Errorf("bad options: %v", err)
	}
	f := mk(4, 1500)
	if n := testing.AllocsPerRun(50, func() { FragmentIPv4(f, pkt, 576) }); n != 0 {
		t.Errorf("%v allocs", n)
	}
}

func TestFragmentIPv6(t *testing.T) {
	src, dst := netip.MustParseAddr("2001:db8:1::1"), netip.MustParseAddr("2001:db8:2::1")
	pkt := make([]byte, IPv6HeaderLen+3000)
	PutIPv6Header(pkt, IPv6Header{PayloadLen: 3000, NextHeader: ProtoESP, HopLimit: 9, Src: src, Dst: dst})
	for i := IPv6HeaderLen; i < len(pkt); i++ {
		pkt[i] = byte(i * 7)
	}
	frags := make([][]byte, 4)
	for i := range frags {
		frags[i] = make([]byte, 1280)
	}
	n, err := FragmentIPv6(frags, pkt, 1280, 0xabcdef01)
	if err != nil || n != 3 {
		t.Fatalf("%d fragments, %v", n, err)
	}
	var payload []byte
	for i, f := range frags[:n] {
		if len(f) > 1280 || f[6] != ProtoFragment || f[40] != ProtoESP || binary.BigEndian.Uint32(f[44:48]) != 0xabcdef01 {
			t.Errorf("fragment %d: %d bytes, next header %d/%d, id %#x", i, len(f), f[6], f[40], binary.BigEndian.Uint32(f[44:48]))
		}
		fo := binary.BigEndian.Uint16(f[42:44])
		if more := fo&1 == 1; more != (i < n-1) {
			t.Errorf("fragment %d: M flag %v", i, more)
		}
		if int(fo&^7) != len(payload) || int(binary.BigEndian.Uint16(f[4:6])) != len(f)-IPv6HeaderLen {
			t.Errorf("fragment %d: offset %d after %d bytes, payload length %d of %d", i, fo&^7, len(payload), binary.BigEndian.Uint16(f[4:6]), len(f)-IPv6HeaderLen)
		}
		if !bytes.Equal(f[:4], pkt[:4]) || !bytes.Equal(f[7:40], pkt[7:40]) {
			t.Errorf("fragment %d: header differs from the packet's", i)
		}
		payload = append(payload, f[48:]...)
	}
	if !bytes.Equal(payload, pkt[IPv6HeaderLen:]) {
		t.Error("the fragments' payloads do not add up to the packet's")
	}
	if _, err := FragmentIPv6(frags[:2], pkt, 1280, 1); err == nil {
		t.Error("too few buffers accepted")
	}
	if _, err := FragmentIPv6(frags, pkt, 50, 1); !errors.Is(err, ErrFragmentMTU) {
		t.Errorf("MTU 50: %v, want ErrFragmentMTU", err)
	}
}
