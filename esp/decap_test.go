package esp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/packet"
)

// sealRaw builds an ESP packet around an arbitrary plaintext (which must be
// aligned), so that trailer checks can be tested with authentic packets.
func sealRaw(t testing.TB, tr crypto.Transform, seq uint64, plaintext []byte) []byte {
	t.Helper()
	if len(plaintext)%tr.BlockSize() != 0 {
		t.Fatalf("plaintext %d not aligned to %d", len(plaintext), tr.BlockSize())
	}
	pkt := make([]byte, HeaderLen+tr.IVSize()+len(plaintext)+tr.ICVSize())
	binary.BigEndian.PutUint32(pkt, 0x100)
	binary.BigEndian.PutUint32(pkt[4:], uint32(seq))
	copy(pkt[HeaderLen+tr.IVSize():], plaintext)
	tr.Seal(pkt, seq)
	return pkt
}

// trailer returns payload followed by the given padding, Pad Length and
// Next Header.
func trailer(payload, pad []byte, padLen int, nh uint8) []byte {
	return append(append(append([]byte(nil), payload...), pad...), byte(padLen), nh)
}

func TestDecapsulateTrailer(t *testing.T) {
	ft := &fakeTransform{iv: 8, bs: 4, icv: 16, key: 4}
	v4 := innerV4(42, 0, false) // 42 + 2 = 44: no padding needed
	v6 := innerV6(58, 0)
	short4 := innerV4(42, 0, false)
	binary.BigEndian.PutUint16(short4[2:4], 30) // TFC padding behind a 30-byte packet
	long4 := innerV4(42, 0, false)
	binary.BigEndian.PutUint16(long4[2:4], 43)
	ihl4 := innerV4(42, 0, false)
	binary.BigEndian.PutUint16(ihl4[2:4], 19)
	opts4 := innerV4(42, 0, false)
	opts4[0] = 0x4f // IHL 60 > total length 42
	for _, tc := range []struct {
		name  string
		plain []byte
		err   error
		inner []byte
	}{
		{"ipv4", trailer(v4, nil, 0, 4), nil, v4},
		{"ipv6 padded", trailer(v6, []byte{1, 2, 3, 4, 5, 6, 7, 8}, 8, 41), nil, v6},
		{"tfc trimmed", trailer(short4, nil, 0, 4), nil, short4[:30]},
		{"bad padding byte", trailer(v6, []byte{1, 2, 4, 4, 5, 6, 7, 8}, 8, 41), ErrPadding, nil},
		{"zero padding", trailer(v6, []byte{0, 0, 0, 0}, 4, 41), ErrPadding, nil},
		{"pad length past payload", trailer(nil, []byte{1, 2}, 3, 4), ErrPadding, nil},
		{"pad length 255", trailer(v4, nil, 255, 4), ErrPadding, nil},
		{"next header tcp", trailer(v4, nil, 0, 6), ErrNextHeader, nil},
		{"next header 0", trailer(v4, nil, 0, 0), ErrNextHeader, nil},
		{"ipv4 says 41", trailer(v4, []byte{1, 2, 3, 4}, 4, 41), ErrInner, nil},
		{"ipv6 says 4", trailer(v6, []byte{1, 2, 3, 4}, 4, 4), ErrInner, nil},
		{"ipv4 length past payload", trailer(long4, nil, 0, 4), ErrInner, nil},
		{"ipv4 length below header", trailer(ihl4, nil, 0, 4), ErrInner, nil},
		{"ipv4 ihl past length", trailer(opts4, nil, 0, 4), ErrInner, nil},
		{"ipv6 payload length past", trailer(v6[:54], []byte{1, 2, 3, 4}, 4, 41), ErrInner, nil},
		{"empty ipv4", trailer(nil, []byte{1, 2}, 2, 4), ErrInner, nil},
		{"dummy", trailer(nil, []byte{1, 2}, 2, 59), ErrDummy, nil},
	} {
		pkt := sealRaw(t, ft, 5, tc.plain)
		d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(32, false)}
		got, seq, err := d.Decapsulate(pkt, 0)
		if err != tc.err {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.err)
			continue
		}
		if seq != 5 {
			t.Errorf("%s: seq %d", tc.name, seq)
		}
		if tc.inner != nil && !bytes.Equal(got, tc.inner) {
			t.Errorf("%s: inner % x, want % x", tc.name, got, tc.inner)
		}
		// Only authentic, well-formed packets move the window.
		recorded := d.Replay.Top() == 5
		if recorded != (err == nil || err == ErrDummy) {
			t.Errorf("%s: window recorded=%v with error %v", tc.name, recorded, err)
		}
	}
}

func TestDecapsulateECN(t *testing.T) {
	ft := &fakeTransform{iv: 8, bs: 4, icv: 16, key: 4}
	const drop = 0xff
	// RFC 6040 section 4.2, indexed [inner][outer]: Not-ECT, ECT(1), ECT(0), CE.
	table := [4][4]uint8{
		packet.ECNNotECT: {packet.ECNNotECT, packet.ECNNotECT, packet.ECNNotECT, drop},
		packet.ECNECT1:   {packet.ECNECT1, packet.ECNECT1, packet.ECNECT1, packet.ECNCE},
		packet.ECNECT0:   {packet.ECNECT0, packet.ECNECT1, packet.ECNECT0, packet.ECNCE},
		packet.ECNCE:     {packet.ECNCE, packet.ECNCE, packet.ECNCE, packet.ECNCE},
	}
	seq := uint64(0)
	for _, v := range []int{4, 6} {
		for in := range uint8(4) {
			for out := range uint8(4) {
				for _, on := range []bool{false, true} {
					seq++
					ip := inner(v, 64, 0xb8|in)
					e := &Encapsulator{SPI: 1, Transform: ft, Outer: outers()[0].o}
					buf, off := place(ip, MaxTrailer)
					p, err := e.Encapsulate(buf, off, 64, seq)
					if err != nil {
						t.Fatal(err)
					}
					d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(64, false), ECN: on}
					got, _, err := d.Decapsulate(buf[p.ESP:p.End], 0x28<<2|out)
					want := table[in][out]
					if !on {
						want = in
					}
					if want == drop {
						if err != ErrECNDrop {
							t.Errorf("v%d inner %d outer %d: %v, want ErrECNDrop", v, in, out, err)
						}
						continue
					}
					if err != nil {
						t.Fatalf("v%d inner %d outer %d: %v", v, in, out, err)
					}
					tos, _ := packet.TOS(got)
					if tos != 0xb8|want {
						t.Errorf("v%d inner %d outer %d ecn=%v: inner TOS %#x, want %#x", v, in, out, on, tos, 0xb8|want)
					}
					if v == 4 {
						if _, err := packet.ParseIPv4Header(got); err != nil {
							t.Errorf("inner IPv4 header after ECN: %v", err)
						}
					}
					ip2 := append([]byte(nil), ip...)
					packet.SetTOS(ip2, 0xb8|want)
					if !bytes.Equal(got, ip2) {
						t.Errorf("v%d: inner changed beyond the ECN field", v)
					}
				}
			}
		}
	}
}

// sealedPacket returns one encapsulated packet's ESP part (a fresh copy).
func sealedPacket(t testing.TB, tr crypto.Transform, o Outer, v, n int, seq uint64) []byte {
	t.Helper()
	e := &Encapsulator{SPI: 0x1234, Transform: tr, Outer: o}
	buf, off := place(inner(v, n, 0x02), MaxTrailer)
	p, err := e.Encapsulate(buf, off, n, seq)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf[p.ESP:p.End]...)
}

// tamperAll flips every bit of pkt in turn and checks that Decapsulate
// rejects each variant with a reason and without panicking.
func tamperAll(t *testing.T, tr crypto.Transform, pkt []byte, esn bool) map[error]int {
	t.Helper()
	reasons := map[error]int{}
	work := make([]byte, len(pkt))
	for i := range len(pkt) * 8 {
		copy(work, pkt)
		work[i/8] ^= 1 << (i % 8)
		d := &Decapsulator{Transform: tr, Replay: NewReplayWindow(64, esn), ECN: true}
		got, _, err := d.Decapsulate(work, 0)
		if err == nil {
			t.Fatalf("bit %d flipped: accepted (%d bytes)", i, len(got))
		}
		reasons[err]++
	}
	return reasons
}

func TestTamperFake(t *testing.T) {
	for _, esn := range []bool{false, true} {
		for _, ft := range fakes(esn) {
			pkt := sealedPacket(t, ft, outers()[0].o, 4, 61, 3)
			r := tamperAll(t, ft, pkt, esn)
			if r[crypto.ErrAuthentication] == 0 {
				t.Fatalf("no authentication failures: %v", r)
			}
		}
	}
}

func TestTruncatedAndOversized(t *testing.T) {
	for _, ft := range fakes(false) {
		pkt := sealedPacket(t, ft, outers()[0].o, 6, 100, 9)
		for n := range len(pkt) {
			d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(64, false)}
			if _, _, err := d.Decapsulate(append([]byte(nil), pkt[:n]...), 0); err == nil {
				t.Fatalf("truncated to %d of %d: accepted", n, len(pkt))
			}
		}
		for _, extra := range []int{1, 3, 4, 16, 1000} {
			d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(64, false)}
			long := append(append([]byte(nil), pkt...), make([]byte, extra)...)
			if _, _, err := d.Decapsulate(long, 0); err == nil {
				t.Fatalf("%d extra bytes: accepted", extra)
			}
		}
	}
}

func TestGarbage(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, ft := range fakes(true) {
		for range 2000 {
			b := make([]byte, r.IntN(200))
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(64, true), ECN: true}
			if _, _, err := d.Decapsulate(b, uint8(r.Uint32())); err == nil {
				t.Fatalf("garbage accepted: % x", b)
			}
		}
	}
}

func TestDecapsulateReplay(t *testing.T) {
	ft := &fakeTransform{iv: 8, bs: 4, icv: 16, key: 4}
	d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(64, false)}
	pkt := sealedPacket(t, ft, outers()[2].o, 4, 80, 42)
	if _, _, err := d.Decapsulate(append([]byte(nil), pkt...), 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Decapsulate(append([]byte(nil), pkt...), 0); err != ErrReplay {
		t.Fatalf("replay: %v", err)
	}
	// Sequence number 0 is never valid.
	if _, _, err := d.Decapsulate(sealedPacket(t, ft, outers()[2].o, 4, 80, 0), 0); err != ErrReplay {
		t.Fatalf("seq 0: %v", err)
	}
	// Without a window nothing is checked and 32-bit numbers are used.
	d0 := &Decapsulator{Transform: ft}
	for range 2 {
		if _, seq, err := d0.Decapsulate(append([]byte(nil), pkt...), 0); err != nil || seq != 42 {
			t.Fatalf("no window: %d %v", seq, err)
		}
	}
}

func TestDecapsulateConcurrent(t *testing.T) {
	ft := &fakeTransform{iv: 8, bs: 4, icv: 16, key: 4}
	const n = 400
	pkts := make([][]byte, n)
	for i := range pkts {
		pkts[i] = sealedPacket(t, ft, outers()[0].o, 4, 60, uint64(i+1))
	}
	d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(1024, true)}
	var accepted [n + 1]atomic.Int32
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every worker tries every packet, in its own order.
			for k := range n {
				i := (k*7 + w*101) % n
				got, seq, err := d.Decapsulate(append([]byte(nil), pkts[i]...), 0)
				switch {
				case err == nil:
					if len(got) != 60 {
						t.Errorf("inner length %d", len(got))
					}
					accepted[seq].Add(1)
				case !errors.Is(err, ErrReplay):
					t.Errorf("seq %d: %v", i+1, err)
				}
			}
		}()
	}
	wg.Wait()
	for i := 1; i <= n; i++ {
		if c := accepted[i].Load(); c != 1 {
			t.Fatalf("seq %d accepted %d times", i, c)
		}
	}
}

func TestSPI(t *testing.T) {
	if _, ok := SPI([]byte{1, 2, 3}); ok {
		t.Error("SPI of 3 bytes")
	}
	if s, ok := SPI([]byte{1, 2, 3, 4}); !ok || s != 0x01020304 {
		t.Errorf("SPI %#x", s)
	}
}
