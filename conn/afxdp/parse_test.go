package afxdp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/packet"
)

// TestParseFrame: parseFrame copies exactly the ESP packet (or UDP
// payload) of a well-formed frame, with its addresses, ports and TOS, and
// refuses, with the error the sockets' path gives, a frame whose headers
// do not hold: what the program passed is checked again here, since the
// program trusts the lengths it does not need.
func TestParseFrame(t *testing.T) {
	esp := espPayload(0x1001, 100)
	ok4 := frame(t, peer4, self4, packet.ProtoESP, esp)
	ok6 := frame(t, peer6, self6, packet.ProtoESP, esp)
	udp4 := frame(t, peer4, self4, packet.ProtoUDP, udpPayload(4501, 4500, esp))
	padded := append(append([]byte(nil), ok4...), make([]byte, 30)...) // Ethernet padding
	mod := func(f []byte, fn func([]byte)) []byte {
		f = append([]byte(nil), f...)
		fn(f)
		return f
	}
	fix4 := func(f []byte) {
		binary.BigEndian.PutUint16(f[ethLen+10:], 0)
		binary.BigEndian.PutUint16(f[ethLen+10:], packet.Checksum(f[ethLen:ethLen+20], 0))
	}
	cases := []struct {
		name string
		f    []byte
		want error
		udp  bool
	}{
		{"esp4", ok4, nil, false},
		{"esp6", ok6, nil, false},
		{"esp4 with Ethernet padding", padded, nil, false},
		{"udp4", udp4, nil, true},
		{"ipv4 checksum", mod(ok4, func(f []byte) { f[ethLen+10]++ }), conn.ErrOuterHeader, false},
		{"ipv4 total length past the frame", mod(ok4, func(f []byte) { f[ethLen+3] += 10; fix4(f) }), conn.ErrOuterHeader, false},
		{"ipv4 fragment", mod(ok4, func(f []byte) { f[ethLen+6] |= 0x20; fix4(f) }), conn.ErrOuterHeader, false},
		{"ipv6 payload length past the frame", mod(ok6, func(f []byte) { f[ethLen+5] += 10 }), conn.ErrOuterHeader, false},
		{"ipv6 truncated header", ok6[:ethLen+30], conn.ErrOuterHeader, false},
		{"not ESP", mod(ok4, func(f []byte) { f[ethLen+9] = 6; fix4(f) }), conn.ErrNotESP, false},
		{"udp to another port", frame(t, peer4, self4, packet.ProtoUDP, udpPayload(4500, 4501, esp)), conn.ErrOuterHeader, true},
		{"udp length past the packet", mod(udp4, func(f []byte) { f[ethLen+20+5] += 10 }), conn.ErrOuterHeader, true},
		{"version 5", mod(ok4, func(f []byte) { f[ethLen] = 0x55 }), conn.ErrOuterHeader, false},
		{"empty", ok4[:ethLen], conn.ErrOuterHeader, false},
	}
	for _, c := range cases {
		m := conn.Message{Buf: make([]byte, 2048)}
		parseFrame(c.f, &m, 4500)
		if !errors.Is(m.Err, c.want) {
			t.Errorf("%s: error %v, want %v", c.name, m.Err, c.want)
			continue
		}
		if c.want != nil {
			continue
		}
		if got := m.Buf[m.Start:m.End]; !bytes.Equal(got, esp) || m.Start != conn.RecvOffset {
			t.Errorf("%s: packet at %d, %d bytes, equal %v", c.name, m.Start, len(got), bytes.Equal(got, esp))
		}
		if m.TOS != 0xb8 || m.UDP != c.udp {
			t.Errorf("%s: TOS %#x UDP %v", c.name, m.TOS, m.UDP)
		}
		if c.udp && (m.Src.Port() != 4501 || m.Dst.Port() != 4500) {
			t.Errorf("%s: ports %v -> %v", c.name, m.Src, m.Dst)
		}
	}
	// A packet longer than the buffer is truncated, not overrun.
	m := conn.Message{Buf: make([]byte, conn.RecvOffset+50)}
	if parseFrame(ok4, &m, 0); !errors.Is(m.Err, conn.ErrTruncated) {
		t.Errorf("short buffer: %v, want ErrTruncated", m.Err)
	}
	// Without ESP-in-UDP, UDP is not ESP.
	m = conn.Message{Buf: make([]byte, 2048)}
	if parseFrame(udp4, &m, 0); !errors.Is(m.Err, conn.ErrNotESP) {
		t.Errorf("udp without the encapsulation port: %v, want ErrNotESP", m.Err)
	}
}

// FuzzParseFrame: no frame makes parseFrame panic or point outside the
// packet it copied.
func FuzzParseFrame(f *testing.F) {
	f.Add(frame(f, peer4, self4, packet.ProtoESP, espPayload(1, 40)))
	f.Add(frame(f, peer6, self6, packet.ProtoUDP, udpPayload(4500, 4500, espPayload(1, 40))))
	f.Fuzz(func(t *testing.T, b []byte) {
		m := conn.Message{Buf: make([]byte, 2048)}
		parseFrame(b, &m, 4500)
		if m.Err == nil && (m.Start != conn.RecvOffset || m.End < m.Start || m.End > len(m.Buf) || m.End-m.Start > len(b)) {
			t.Fatalf("Start %d End %d for a %d-byte frame", m.Start, m.End, len(b))
		}
	})
}
