package esp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/espd/espd/packet"
)

func TestRoundTripFake(t *testing.T) {
	for _, esn := range []bool{false, true} {
		for _, ft := range fakes(esn) {
			for _, oc := range outers() {
				for _, v := range []int{4, 6} {
					for _, n := range []int{48, 49, 50, 51, 100, 1400} {
						name := fmt.Sprintf("esn=%v/iv%d-bs%d-icv%d/%s/inner%d/%d", esn, ft.iv, ft.bs, ft.icv, oc.name, v, n)
						e := &Encapsulator{SPI: 0xc0ffee01, Transform: ft, Outer: oc.o}
						d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(64, esn)}
						in := inner(v, n, 0)
						buf, off := place(in, MaxTrailer)
						seq := uint64(n)
						p, err := e.Encapsulate(buf, off, n, seq)
						if err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						if _, _, err := checkOuter(buf[:cap(buf)], p, oc.o, e.SPI, seq); err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						plain := p.End - p.ESP - HeaderLen - ft.iv - ft.icv
						if plain%ft.bs != 0 || plain-n-2 >= ft.bs || plain < n+2 {
							t.Fatalf("%s: plaintext %d bytes for %d inner, block %d", name, plain, n, ft.bs)
						}
						out, gotSeq, err := d.Decapsulate(buf[p.ESP:p.End], 0)
						if err != nil {
							t.Fatalf("%s: decapsulate: %v", name, err)
						}
						if gotSeq != seq || !bytes.Equal(out, in) {
							t.Fatalf("%s: got seq %d, inner differs: %v", name, gotSeq, !bytes.Equal(out, in))
						}
					}
				}
			}
		}
	}
}

func TestESNAcrossBoundaryFake(t *testing.T) {
	ft := &fakeTransform{iv: 8, bs: 4, icv: 16, key: 9, esn: true}
	e := &Encapsulator{SPI: 1, Transform: ft, Outer: outers()[0].o}
	d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(128, true)}
	send := func(seq uint64) ([]byte, error) {
		buf, off := place(innerV4(60, 0, false), MaxTrailer)
		p, err := e.Encapsulate(buf, off, 60, seq)
		if err != nil {
			t.Fatal(err)
		}
		out, got, err := d.Decapsulate(buf[p.ESP:p.End], 0)
		if err == nil && got != seq {
			t.Fatalf("seq %#x decapsulated as %#x", seq, got)
		}
		return out, err
	}
	// March across 2^32 with reordering: late packets from below the
	// boundary after newer ones above it.
	base := uint64(1)<<32 - 100
	order := []uint64{}
	for i := uint64(0); i < 300; i += 3 {
		order = append(order, base+i+2, base+i, base+i+1)
	}
	for _, s := range order {
		if _, err := send(s); err != nil {
			t.Fatalf("seq %#x: %v", s, err)
		}
	}
	if _, err := send(base + 250); err != ErrReplay {
		t.Fatalf("duplicate across boundary: %v", err)
	}
	// Too old: below the window, inferred into the next cycle, fails the ICV.
	if _, err := send(base + 150); err == nil {
		t.Fatalf("packet older than the window accepted")
	}
	// A packet of the next 2^32 cycle far ahead (up to 2^32 - W past the top) is inferred right.
	if _, err := send(uint64(2)<<32 + 50); err != nil {
		t.Fatalf("next cycle: %v", err)
	}
	// A late packet from before the boundary, still in the window.
	d.Replay = NewReplayWindow(128, true)
	if _, err := send(uint64(1)<<32 - 50); err != nil {
		t.Fatal(err)
	}
	if _, err := send(uint64(1)<<32 + 20); err != nil {
		t.Fatal(err)
	}
	if _, err := send(uint64(1)<<32 - 30); err != nil {
		t.Fatalf("late packet from the previous cycle: %v", err)
	}
}

func TestOuterHeaderFields(t *testing.T) {
	ft := &fakeTransform{iv: 8, bs: 4, icv: 16, key: 1}
	for _, oc := range outers() {
		for _, v := range []int{4, 6} {
			for _, innerTOS := range []uint8{0x00, 0x01, 0x02, 0x03, 0xb8, 0xb9, 0xba, 0xbb, 0x2f} {
				for _, ecn := range []bool{false, true} {
					for _, copyDSCP := range []bool{false, true} {
						for _, ttl := range []uint8{0, 1, 200} {
							o := oc.o
							o.ECN, o.CopyDSCP, o.DSCP, o.TTL = ecn, copyDSCP, 10, ttl
							e := &Encapsulator{SPI: 7, Transform: ft, Outer: o}
							buf, off := place(inner(v, 64, innerTOS), MaxTrailer)
							seq := uint64(0x1234567_89abc)
							p, err := e.Encapsulate(buf, off, 64, seq)
							if err != nil {
								t.Fatal(err)
							}
							tos, _, err := checkOuter(buf, p, o, 7, seq)
							if err != nil {
								t.Fatalf("%s inner%d: %v", oc.name, v, err)
							}
							wantDSCP := uint8(10)
							if copyDSCP {
								wantDSCP = innerTOS >> 2
							}
							wantECN := uint8(packet.ECNNotECT)
							if ecn {
								wantECN = innerTOS & 3
							}
							if tos != wantDSCP<<2|wantECN {
								t.Fatalf("%s inner%d tos %#x ecn=%v copy=%v: outer TOS %#x, want %#x",
									oc.name, v, innerTOS, ecn, copyDSCP, tos, wantDSCP<<2|wantECN)
							}
						}
					}
				}
			}
		}
	}
}

func TestOuterDF(t *testing.T) {
	ft := &fakeTransform{iv: 8, bs: 4, icv: 16, key: 1}
	for _, udp := range []bool{false, true} {
		o := outers()[0].o
		if udp {
			o = outers()[1].o
		}
		for _, tc := range []struct {
			mode  DFMode
			inner []byte
			want  bool
		}{
			{DFCopy, innerV4(60, 0, true), true},
			{DFCopy, innerV4(60, 0, false), false},
			{DFCopy, innerV6(60, 0), true},
			{DFSet, innerV4(60, 0, false), true},
			{DFSet, innerV6(60, 0), true},
			{DFClear, innerV4(60, 0, true), false},
			{DFClear, innerV6(60, 0), false},
		} {
			o.DF = tc.mode
			e := &Encapsulator{SPI: 7, Transform: ft, Outer: o}
			buf, off := place(tc.inner, MaxTrailer)
			p, err := e.Encapsulate(buf, off, len(tc.inner), 3)
			if err != nil {
				t.Fatal(err)
			}
			_, h, err := checkOuter(buf, p, o, 7, 3)
			if err != nil {
				t.Fatal(err)
			}
			if h.DF != tc.want {
				t.Errorf("DF mode %v, inner v%d: DF %v, want %v", tc.mode, tc.inner[0]>>4, h.DF, tc.want)
			}
		}
	}
}

func TestOverheadAndInnerMTU(t *testing.T) {
	for _, ft := range fakes(false) {
		for _, oc := range outers() {
			for _, tfc := range []int{0, 300} {
				e := &Encapsulator{SPI: 1, Transform: ft, Outer: oc.o, TFCPadTo: tfc}
				for n := 28; n <= 1500; n++ {
					buf, off := place(innerV4(n, 0, false), MaxTrailer+tfc)
					p, err := e.Encapsulate(buf, off, n, 1)
					if err != nil {
						t.Fatal(err)
					}
					if got := wireLen(p, e.Outer) - n; got != e.Overhead(n) {
						t.Fatalf("%s tfc %d n %d: overhead %d, Overhead() %d", oc.name, tfc, n, got, e.Overhead(n))
					}
				}
				for m := 300; m <= 9000; m += 7 {
					i := e.InnerMTU(m)
					if i < tfc {
						continue // TFCPadTo past the MTU pads past it: documented
					}
					if i+e.Overhead(i) > m {
						t.Fatalf("%s: InnerMTU(%d) = %d does not fit (%d)", oc.name, m, i, i+e.Overhead(i))
					}
					if i+1+e.Overhead(i+1) <= m {
						t.Fatalf("%s: InnerMTU(%d) = %d is not the largest", oc.name, m, i)
					}
				}
				if e.InnerMTU(40) != 0 {
					t.Fatalf("InnerMTU(40) = %d", e.InnerMTU(40))
				}
			}
		}
	}
}

func TestEncapsulateErrors(t *testing.T) {
	ft := &fakeTransform{iv: 16, bs: 16, icv: 12, key: 1}
	for _, oc := range outers() {
		e := &Encapsulator{SPI: 1, Transform: ft, Outer: oc.o}
		in := innerV4(100, 0, false)
		need := e.Overhead(100) - (16-(100+2)%16)%16 - 2 - 12 // headroom
		total := need + e.Overhead(100) - need + 100
		// Exactly enough headroom and capacity works.
		b := make([]byte, total)
		copy(b[need:], in)
		if _, err := e.Encapsulate(b[:need+100], need, 100, 1); err != nil {
			t.Fatalf("%s: exact fit: %v", oc.name, err)
		}
		check := func(name string, buf []byte, off, n int, want error) {
			t.Helper()
			before := append([]byte(nil), buf[:cap(buf)]...)
			if _, err := e.Encapsulate(buf, off, n, 1); err != want {
				t.Errorf("%s %s: %v, want %v", oc.name, name, err, want)
			}
			if !bytes.Equal(before, buf[:cap(buf)]) {
				t.Errorf("%s %s: buffer changed on error", oc.name, name)
			}
		}
		b2 := make([]byte, total)
		copy(b2[need-1:], in)
		check("headroom", b2[:need-1+100], need-1, 100, ErrHeadroom)
		b3 := make([]byte, total-1)
		copy(b3[need:], in)
		check("capacity", b3[:need+100], need, 100, ErrTailroom)
		b4 := make([]byte, total)
		copy(b4[need:], in)
		b4[need] = 0x55
		check("version", b4, need, 100, ErrInner)
		check("short v4", b4[:need+19], need, 19, ErrInner)
		b5 := make([]byte, total)
		copy(b5[need:], innerV4(100, 0, false))
		check("length field past n", b5, need, 99, ErrInner)
		check("empty", b5, need, 0, ErrInner)
		b7 := make([]byte, total)
		copy(b7[need:], innerV4(100, 0, false))
		b7[need+3] = 19 // total length below the header
		check("length field below header", b7, need, 100, ErrInner)
		check("negative offset", b5, -1, 10, ErrInner)
		check("past capacity", b5, need, total, ErrInner)
		v6 := innerV6(100, 0)
		b6 := make([]byte, total)
		copy(b6[need:], v6)
		check("short v6", b6, need, 39, ErrInner)
	}
	// Mixed families.
	e := &Encapsulator{SPI: 1, Transform: ft, Outer: Outer{Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("2001:db8::1")}}
	buf, off := place(innerV4(60, 0, false), MaxTrailer)
	if _, err := e.Encapsulate(buf, off, 60, 1); err != ErrOuter {
		t.Errorf("mixed families: %v", err)
	}
	// 65535 limit.
	e.Outer = outers()[0].o
	big := make([]byte, MaxHeadroom+65535+MaxTrailer)
	copy(big[MaxHeadroom:], innerV4(65535, 0, false))
	if _, err := e.Encapsulate(big[:MaxHeadroom+65535], MaxHeadroom, 65535, 1); err != ErrTooBig {
		t.Errorf("65535-byte inner: %v", err)
	}
}

func TestTFCPadding(t *testing.T) {
	for _, ft := range fakes(false) {
		for _, oc := range outers() {
			e := &Encapsulator{SPI: 1, Transform: ft, Outer: oc.o, TFCPadTo: 500}
			d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(64, false)}
			for i, tc := range []struct{ n, tail int }{
				{100, 1000},       // padded to 500
				{600, 1000},       // longer than TFCPadTo: no TFC
				{100, 200},        // bounded by capacity
				{100, MaxTrailer}, // barely any room
			} {
				in := innerV4(tc.n, 0, false)
				buf, off := place(in, tc.tail)
				p, err := e.Encapsulate(buf, off, tc.n, uint64(i+1))
				if err != nil {
					t.Fatalf("case %d: %v", i, err)
				}
				plain := p.End - p.ESP - HeaderLen - ft.iv - ft.icv
				want := min((max(tc.n, 500)+2+ft.bs-1)/ft.bs*ft.bs, (tc.n+tc.tail-ft.icv)/ft.bs*ft.bs)
				if plain != want || p.End > cap(buf) {
					t.Fatalf("%s case %d: plaintext %d, want %d (end %d cap %d)", oc.name, i, plain, want, p.End, cap(buf))
				}
				if tc.tail >= 1000 && wireLen(p, e.Outer) != tc.n+e.Overhead(tc.n) {
					t.Fatalf("case %d: length %d, Overhead says %d", i, wireLen(p, e.Outer), tc.n+e.Overhead(tc.n))
				}
				out, _, err := d.Decapsulate(buf[p.ESP:p.End], 0)
				if err != nil || !bytes.Equal(out, in) {
					t.Fatalf("%s case %d: %v, inner equal %v", oc.name, i, err, bytes.Equal(out, in))
				}
			}
		}
	}
}

func TestDummy(t *testing.T) {
	for _, ft := range fakes(true) {
		for _, oc := range outers() {
			o := oc.o
			o.DSCP = 12
			o.ECN = true
			e := &Encapsulator{SPI: 5, Transform: ft, Outer: o}
			d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(64, true), ECN: true}
			for _, n := range []int{0, 1, 77, 500} {
				buf := make([]byte, MaxHeadroom+n+MaxTrailer)
				for i := range buf {
					buf[i] = 0xee
				}
				seq := uint64(n + 1)
				p, err := e.EncapsulateDummy(buf[:MaxHeadroom], MaxHeadroom, n, seq)
				if err != nil {
					t.Fatal(err)
				}
				tos, _, err := checkOuter(buf, p, o, 5, seq)
				if err != nil || tos != 12<<2 {
					t.Fatalf("dummy outer: tos %#x, %v", tos, err)
				}
				pkt := append([]byte(nil), buf[p.ESP:p.End]...)
				if _, _, err := d.Decapsulate(buf[p.ESP:p.End], 0); err != ErrDummy {
					t.Fatalf("%s n %d: %v, want ErrDummy", oc.name, n, err)
				}
				if d.Replay.Top() != seq {
					t.Fatalf("dummy not recorded in the window")
				}
				if _, _, err := d.Decapsulate(pkt, 0); err != ErrReplay {
					t.Fatalf("replayed dummy: %v", err)
				}
			}
		}
	}
}

func TestEncapsulateAllocs(t *testing.T) {
	ft := &fakeTransform{iv: 8, bs: 4, icv: 16, key: 1}
	e := &Encapsulator{SPI: 1, Transform: ft, Outer: outers()[3].o, TFCPadTo: 200}
	in := innerV6(100, 0)
	buf, off := place(in, 400)
	if n := testing.AllocsPerRun(100, func() {
		copy(buf[off:], in)
		if _, err := e.Encapsulate(buf, off, len(in), 1); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocs", n)
	}
	_ = errors.Is
	_ = binary.BigEndian
}

func TestEncapsulateRandomInner(t *testing.T) {
	ft := &fakeTransform{iv: 8, bs: 4, icv: 16, key: 1}
	e := &Encapsulator{SPI: 1, Transform: ft, Outer: outers()[1].o}
	d := &Decapsulator{Transform: ft}
	r := rand.New(rand.NewPCG(11, 12))
	ok := 0
	for range 20000 {
		n := r.IntN(120)
		buf := make([]byte, MaxHeadroom+n+MaxTrailer)
		in := buf[MaxHeadroom : MaxHeadroom+n]
		for i := range in {
			in[i] = byte(r.Uint32())
		}
		switch k := r.IntN(4); {
		case k == 0 && n >= 20: // plausible IPv4: length field within n
			in[0] = 0x40 | in[0]&0x0f
			binary.BigEndian.PutUint16(in[2:4], uint16(20+r.IntN(n-19)))
		case k == 1 && n >= 40: // plausible IPv6
			in[0] = 0x60 | in[0]&0x0f
			binary.BigEndian.PutUint16(in[4:6], uint16(r.IntN(n-39)))
		}
		want := append([]byte(nil), in...)
		p, err := e.Encapsulate(buf[:MaxHeadroom+n], MaxHeadroom, n, 1)
		if err != nil {
			if err != ErrInner {
				t.Fatalf("% x: %v", want, err)
			}
			continue
		}
		got, _, err := d.Decapsulate(buf[p.ESP:p.End], 0)
		if err != nil || !bytes.Equal(got, want[:len(got)]) {
			t.Fatalf("% x: round trip: %v", want, err)
		}
		ok++
	}
	if ok < 1000 {
		t.Fatalf("only %d of 20000 random inner packets were encapsulated", ok)
	}
}
