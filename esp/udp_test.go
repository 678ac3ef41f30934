package esp

import (
	"testing"
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

func TestKeepalive(t *testing.T) {
	var b [4]byte
	if n := PutKeepalive(b[:]); n != 1 || ClassifyUDP(b[:n]) != UDPKeepalive {
		t.Fatalf("keepalive %d % x", n, b[:n])
	}
	if PutKeepalive(nil) != 0 {
		t.Fatal("keepalive into an empty buffer")
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
