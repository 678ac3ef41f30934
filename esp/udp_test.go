package esp

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/espd/espd/packet"
)

func TestClassifyUDP(t *testing.T) {
	ike := append([]byte{0, 0, 0, 0}, make([]byte, 28)...)
	ike[4] = 0x11 // initiator SPI
	for _, tc := range []struct {
		name string
		b    []byte
		want UDPKind
	}{
		{"empty", nil, UDPMalformed},
		{"keepalive", []byte{0xff}, UDPKeepalive},
		{"one other byte", []byte{0x00}, UDPMalformed},
		{"two bytes ff", []byte{0xff, 0xff}, UDPMalformed},
		{"short spi", []byte{1, 2, 3, 4, 5, 6, 7}, UDPMalformed},
		{"esp header", []byte{0, 0, 1, 0, 0, 0, 0, 1}, UDPESP},
		{"esp", append([]byte{0xc0, 1, 2, 3}, make([]byte, 40)...), UDPESP},
		{"bare marker", []byte{0, 0, 0, 0}, UDPMalformed},
		{"marker and short ike", ike[:31], UDPMalformed},
		{"ike", ike, UDPIKE},
		{"ike long", append(ike, make([]byte, 500)...), UDPIKE},
	} {
		if got := ClassifyUDP(tc.b); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	for k := UDPMalformed; k <= UDPKeepalive; k++ {
		if k.String() == "UDPKind(?)" {
			t.Errorf("kind %d has no name", k)
		}
	}
}

func TestKeepaliveAndUDPFraming(t *testing.T) {
	var b [4]byte
	if n := PutKeepalive(b[:]); n != 1 || ClassifyUDP(b[:n]) != UDPKeepalive {
		t.Fatalf("keepalive %d % x", n, b[:n])
	}
	if PutKeepalive(nil) != 0 {
		t.Fatal("keepalive into an empty buffer")
	}
	for _, fam := range [][2]string{{"198.18.0.1", "198.19.0.1"}, {"2001:db8::1", "2001:db8::2"}} {
		src, dst := netip.MustParseAddr(fam[0]), netip.MustParseAddr(fam[1])
		buf := make([]byte, 100)
		payload := []byte{0xc0, 1, 2, 3, 0, 0, 0, 9, 0xaa, 0xbb}
		copy(buf[20:], payload)
		s, err := PrependUDP(buf, 20, 30, 4500, 4501, src, dst)
		if err != nil || s != 12 {
			t.Fatalf("PrependUDP: %d %v", s, err)
		}
		if !packet.UDPChecksumValid(buf[s:30], src, dst) {
			t.Fatal("checksum invalid")
		}
		if src.Is4() != (buf[s+6]|buf[s+7] == 0) {
			t.Fatalf("checksum % x for %v", buf[s+6:s+8], src)
		}
		p, sp, dp, err := StripUDP(buf[s:30])
		if err != nil || sp != 4500 || dp != 4501 || !bytes.Equal(p, payload) {
			t.Fatalf("StripUDP: % x %d %d %v", p, sp, dp, err)
		}
		if _, err := PrependUDP(buf, 7, 30, 1, 2, src, dst); err != ErrHeadroom {
			t.Fatalf("headroom: %v", err)
		}
		if _, err := PrependUDP(buf, 20, 101, 1, 2, src, dst); err != ErrMalformed {
			t.Fatalf("range: %v", err)
		}
	}
	for _, bad := range [][]byte{nil, {0, 1, 0, 2, 0, 7, 0, 0}, {0, 1, 0, 2, 0, 20, 0, 0}} {
		if _, _, _, err := StripUDP(bad); err != ErrMalformed {
			t.Errorf("StripUDP(% x): %v", bad, err)
		}
	}
}

func FuzzClassifyUDP(f *testing.F) {
	f.Add([]byte{0xff})
	f.Add([]byte{0, 0, 0, 0})
	f.Add(append([]byte{0, 0, 0, 0}, make([]byte, 28)...))
	f.Add([]byte{1, 2, 3, 4, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		k := ClassifyUDP(b)
		switch k {
		case UDPKeepalive:
			if len(b) != 1 || b[0] != 0xff {
				t.Fatalf("keepalive % x", b)
			}
		case UDPESP:
			if spi, ok := SPI(b); !ok || spi == 0 || len(b) < HeaderLen {
				t.Fatalf("ESP % x", b)
			}
		case UDPIKE:
			if len(b) < 32 || b[0]|b[1]|b[2]|b[3] != 0 {
				t.Fatalf("IKE % x", b)
			}
		case UDPMalformed:
			if len(b) == 1 && b[0] == 0xff || len(b) >= 8 && b[0]|b[1]|b[2]|b[3] != 0 || len(b) >= 32 {
				t.Fatalf("malformed % x", b)
			}
		default:
			t.Fatalf("kind %d", k)
		}
	})
}
