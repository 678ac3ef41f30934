package esp

import (
	"bytes"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/packet"
)

// TestOpenRecordsNothing: Open checks the window but leaves it alone, so
// the same packet opens twice; Update then records it once and refuses
// the duplicate, and Open refuses the recorded number.
func TestOpenRecordsNothing(t *testing.T) {
	ft := &fakeTransform{iv: 8, bs: 4, icv: 16, key: 4}
	d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(64, false)}
	pkt := sealedPacket(t, ft, outers()[0].o, 4, 80, 42)
	want := inner(4, 80, 0x02)
	for i := range 2 {
		got, seq, err := d.Open(append([]byte(nil), pkt...), 0)
		if err != nil || seq != 42 || !bytes.Equal(got, want) {
			t.Fatalf("Open #%d: seq %d err %v inner % x", i+1, seq, err, got)
		}
		if top := d.Replay.Top(); top != 0 {
			t.Fatalf("Open #%d recorded: top %d", i+1, top)
		}
	}
	if err := d.Replay.Update(42); err != nil {
		t.Fatalf("first Update: %v", err)
	}
	if err := d.Replay.Update(42); err != ErrReplay {
		t.Fatalf("Update of the duplicate: %v, want ErrReplay", err)
	}
	if _, _, err := d.Open(append([]byte(nil), pkt...), 0); err != ErrReplay {
		t.Fatalf("Open after Update: %v, want ErrReplay", err)
	}
	if d.Replay.Top() != 42 {
		t.Fatalf("top %d", d.Replay.Top())
	}
}

// TestOpenAuthentic: dummy and ECN-dropped packets are authentic (their
// number is returned for the caller to record) and Open records neither;
// Decapsulate records them, and refuses their duplicates as replays.
func TestOpenAuthentic(t *testing.T) {
	ft := &fakeTransform{iv: 8, bs: 4, icv: 16, key: 4}
	dummy := sealRaw(t, ft, 7, trailer(nil, []byte{1, 2}, 2, NextHeaderDummy))
	notECT := inner(4, 64, 0) // Not-ECT inner packet
	e := &Encapsulator{SPI: 1, Transform: ft, Outer: outers()[0].o}
	buf, off := place(notECT, MaxTrailer)
	p, err := e.Encapsulate(buf, off, len(notECT), 8)
	if err != nil {
		t.Fatal(err)
	}
	ceDrop := append([]byte(nil), buf[p.ESP:p.End]...)
	tampered := append([]byte(nil), ceDrop...)
	tampered[len(tampered)-1] ^= 1
	for _, tc := range []struct {
		name      string
		pkt       []byte
		seq       uint64
		err       error
		authentic bool
	}{
		{"dummy", dummy, 7, ErrDummy, true},
		{"CE on Not-ECT", ceDrop, 8, ErrECNDrop, true},
		{"tampered", tampered, 8, crypto.ErrAuthentication, false},
	} {
		d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(64, false), ECN: true}
		inner, seq, err := d.Open(append([]byte(nil), tc.pkt...), packet.ECNCE)
		if err != tc.err || seq != tc.seq || inner != nil {
			t.Errorf("%s: Open = %d bytes, seq %d, %v; want nil, %d, %v", tc.name, len(inner), seq, err, tc.seq, tc.err)
		}
		if Authentic(err) != tc.authentic {
			t.Errorf("%s: Authentic(%v) = %v", tc.name, err, !tc.authentic)
		}
		if d.Replay.Top() != 0 {
			t.Errorf("%s: Open recorded", tc.name)
		}
		_, _, err = d.Decapsulate(append([]byte(nil), tc.pkt...), packet.ECNCE)
		if err != tc.err {
			t.Errorf("%s: Decapsulate: %v", tc.name, err)
		}
		if recorded := d.Replay.Top() == tc.seq; recorded != tc.authentic {
			t.Errorf("%s: Decapsulate recorded=%v", tc.name, recorded)
		}
		if _, _, err := d.Decapsulate(append([]byte(nil), tc.pkt...), packet.ECNCE); tc.authentic && err != ErrReplay {
			t.Errorf("%s: duplicate: %v, want ErrReplay", tc.name, err)
		}
	}
	for _, err := range []error{ErrReplay, ErrPadding, ErrMalformed, ErrNextHeader, ErrInner, crypto.ErrAuthentication} {
		if Authentic(err) {
			t.Errorf("Authentic(%v)", err)
		}
	}
}

// TestOpenInferLaggingRecord opens an ESN stream that crosses 2^32 while
// the window records it lag behind, as an in-order stage does behind
// parallel workers: every number is inferred right and recorded once, and
// a late packet from before the boundary, within the window, is inferred
// into the old cycle.
func TestOpenInferLaggingRecord(t *testing.T) {
	ft := &fakeTransform{iv: 8, bs: 4, icv: 16, key: 5, esn: true}
	for _, lag := range []int{1, 31, 32, 500, 3000} {
		d := &Decapsulator{Transform: ft, Replay: NewReplayWindow(32, true)}
		const first = uint64(1)<<32 - 1500
		if err := d.Replay.Update(first - 1); err != nil {
			t.Fatal(err)
		}
		var opened []uint64
		for s := first; s < first+3000; s++ {
			_, seq, err := d.Open(sealedPacket(t, ft, outers()[0].o, 4, 40, s), 0)
			if err != nil || seq != s {
				t.Fatalf("lag %d: Open of %#x = %#x, %v (top %#x)", lag, s, seq, err, d.Replay.Top())
			}
			opened = append(opened, seq)
			if len(opened) > lag {
				if err := d.Replay.Update(opened[0]); err != nil {
					t.Fatalf("lag %d: Update(%#x): %v", lag, opened[0], err)
				}
				opened = opened[1:]
			}
			if s == 1<<32+2 {
				// Top is still below 2^32 for the larger lags, just past
				// it for the smaller ones: either way 2^32-3 is found.
				late := uint64(1)<<32 - 3
				if _, seq, err := d.Open(sealedPacket(t, ft, outers()[0].o, 4, 40, late), 0); seq != late || (err != nil && err != ErrReplay) {
					t.Fatalf("lag %d: late packet %#x inferred as %#x, %v (top %#x)", lag, late, seq, err, d.Replay.Top())
				}
			}
		}
		for _, s := range opened {
			if err := d.Replay.Update(s); err != nil {
				t.Fatalf("lag %d: final Update(%#x): %v", lag, s, err)
			}
		}
		if d.Replay.Top() != first+2999 {
			t.Fatalf("lag %d: top %#x", lag, d.Replay.Top())
		}
	}
}
