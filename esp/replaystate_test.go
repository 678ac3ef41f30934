package esp

import (
	"math/rand/v2"
	"testing"
)

const b32 = uint64(1) << 32

// kernelSeqHi is the high half the Linux kernel's xfrm_replay_seqhi (6.1)
// infers for seqLo, written from its description in Infer's doc comment:
// the test shows where Infer agrees with it and where it deliberately
// does not.
func kernelSeqHi(top uint64, w uint32, seqLo uint32) uint32 {
	th, tl := uint32(top>>32), uint32(top)
	bottom := tl - w + 1
	if tl >= w-1 {
		if seqLo < bottom {
			th++ // wraps at 2^32-1
		}
		return th
	}
	if seqLo >= bottom {
		th-- // wraps at 0
	}
	return th
}

// TestInferKernelCases covers every case of the kernel's inference with a
// window of 64 (espd and the kernel then have the same bottom).
func TestInferKernelCases(t *testing.T) {
	const w = 64
	for _, tc := range []struct {
		name   string
		top    uint64
		lo     uint32
		want   uint64
		kernel bool // whether the kernel infers the same
	}{
		{"empty state, first packet small", 0, 1, 1, true},
		{"empty state, first packet 100", 0, 100, 100, true},
		{"empty state, first packet 2^32-3 inside the window's bottom", 0, 1<<32 - 3, b32 - 3, false},
		{"empty state, first packet 2^32-63, the bottom", 0, 1<<32 - 63, b32 - 63, false},
		{"empty state, first packet 2^32-64, below the bottom", 0, 1<<32 - 64, b32 - 64, true},
		{"top 10 (high half 0), packet 2^32-5 inside the bottom", 10, 1<<32 - 5, b32 - 5, false},
		{"replay-seq 2^32-4, next packet", b32 - 4, 1<<32 - 3, b32 - 3, true},
		{"replay-seq 2^32-4, packet after the crossing", b32 - 4, 1, b32 + 1, true},
		{"replay-seq 2^32+5, packet before the crossing", b32 + 5, 1<<32 - 10, b32 - 10, true},
		{"replay-seq 2^32+5, packet ahead", b32 + 5, 100, b32 + 100, true},
		{"top 2^32-1, packet 0 (crossing)", b32 - 1, 0, b32, true},
		{"last subspace, packet below the window", 0xffffffff<<32 | 0x1000, 5, 0xffffffff<<32 | 5, false},
		{"last subspace, packet in the window", 0xffffffff<<32 | 0x1000, 0x1000 - 10, 0xffffffff<<32 | (0x1000 - 10), true},
	} {
		r := NewReplayWindow(w, true)
		r.Merge(tc.top, nil)
		got := r.Infer(tc.lo)
		if got != tc.want {
			t.Errorf("%s: Infer(%#x) = %#x, want %#x", tc.name, tc.lo, got, tc.want)
		}
		k := uint64(kernelSeqHi(tc.top, w, tc.lo))<<32 | uint64(tc.lo)
		if (k == got) != tc.kernel {
			t.Errorf("%s: the kernel infers %#x, espd %#x; the table says they agree: %v", tc.name, k, got, tc.kernel)
		}
	}
}

// TestInferPeerStartsBelow2to32 receives a peer whose numbers start just
// below 2^32 into a window that has seen nothing, across the crossing.
func TestInferPeerStartsBelow2to32(t *testing.T) {
	for _, size := range []uint32{64, 128, 1024, 0} {
		r := NewReplayWindow(size, true)
		for s := b32 - 3; s < b32+5; s++ {
			got := r.Infer(uint32(s))
			if got != s {
				t.Fatalf("size %d: Infer(%#x) = %#x, want %#x", size, uint32(s), got, s)
			}
			if err := r.Check(got); err != nil {
				t.Fatalf("size %d: %#x refused: %v", size, got, err)
			}
			if err := r.Update(got); err != nil {
				t.Fatalf("size %d: %#x not recorded: %v", size, got, err)
			}
		}
	}
}

// TestReplayMerge merges random replay states into random windows and
// checks the union rule against a model.
func TestReplayMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 400 {
		size := []uint32{64, 128, 256, 1024}[rng.IntN(4)]
		esn := rng.IntN(2) == 0
		r := NewReplayWindow(size, esn)
		base := uint64(rng.IntN(3000))
		if esn && rng.IntN(2) == 0 {
			base += b32 - 1500
		}
		for range rng.IntN(200) {
			q := base + uint64(rng.IntN(2000))
			if q == 0 {
				continue
			}
			if r.Check(q) == nil {
				r.Update(q)
			}
		}
		cur := r.Top()
		var top uint64
		switch rng.IntN(3) {
		case 0:
			top = cur + uint64(rng.IntN(3000)) // ahead, maybe past the ring
		case 1:
			top = max(cur, 1) - uint64(rng.IntN(int(min(max(cur, 1), 500))))
		default:
			top = base + uint64(rng.IntN(2000))
		}
		if top == 0 {
			top = 1
		}
		bm := make([]byte, rng.IntN(int(r.Size()/8)+1))
		for i := range bm {
			bm[i] = byte(rng.Uint32())
		}
		nt := max(cur, top)
		lo := uint64(1)
		if nt > 2*uint64(r.Size()) {
			lo = nt - 2*uint64(r.Size())
		}
		before := map[uint64]bool{}
		for q := lo; q <= nt+10; q++ {
			before[q] = r.Check(q) != nil
		}
		r.Merge(top, bm)
		if r.Top() != nt {
			t.Fatalf("iter %d: top %d, want %d", iter, r.Top(), nt)
		}
		for q := lo; q <= nt+10; q++ {
			var want bool
			switch {
			case q > nt:
				want = false
			case nt-q >= uint64(r.Size()):
				want = true
			default:
				want = before[q] || ReplayStateSeen(top, bm, q)
			}
			if got := r.Check(q) != nil; got != want {
				t.Fatalf("iter %d (size %d cur %d top %d): seq %d refused %v, want %v", iter, size, cur, top, q, got, want)
			}
			if before[q] && r.Check(q) == nil {
				t.Fatalf("iter %d: seq %d was refused before the merge and is accepted after", iter, q)
			}
		}
		// Update agrees with Check after a merge.
		if err := r.Update(nt); err == nil {
			t.Fatalf("iter %d: the top %d accepted again", iter, nt)
		}
	}
}

// TestReplayBitmapRoundTrip reads a window's state back and sets it on a
// fresh window of the same size: both refuse exactly the same numbers.
func TestReplayBitmapRoundTrip(t *testing.T) {
	r := NewReplayWindow(128, true)
	if r.Bitmap() != nil {
		t.Fatal("an empty window has a bitmap")
	}
	for _, q := range []uint64{b32 + 7, b32 + 3, b32 - 20, b32 + 100, b32 + 50, b32 + 98} {
		if err := r.Update(q); err != nil {
			t.Fatal(err)
		}
	}
	bm := r.Bitmap()
	if len(bm) != 16 {
		t.Fatalf("bitmap of %d bytes, want 16", len(bm))
	}
	// Bit 0 is the top (b32+100), bit 2 is b32+98, bit 50 is b32+50.
	for _, i := range []uint{0, 2, 50, 93, 97} {
		if bm[i/8]&(1<<(i%8)) == 0 {
			t.Errorf("bit %d clear", i)
		}
	}
	if bm[0] != 0b101 {
		t.Errorf("first byte %08b, want 00000101", bm[0])
	}
	n := NewReplayWindow(128, true)
	n.Merge(r.Top(), bm)
	for q := b32 - 200; q < b32+110; q++ {
		if (r.Check(q) != nil) != (n.Check(q) != nil) {
			t.Errorf("seq %#x: %v before, %v after the round trip", q, r.Check(q), n.Check(q))
		}
	}
	// A small top: no bits for numbers below 1.
	s := NewReplayWindow(64, false)
	s.Update(3)
	if got := s.Bitmap(); got[0] != 1 || len(got) != 8 {
		t.Errorf("bitmap with top 3: %v", got)
	}
}

// TestReplayStateSeen pins the bitmap layout.
func TestReplayStateSeen(t *testing.T) {
	bm := []byte{0b0000_0010} // bit 1: top-1 seen; bits 2-7 clear
	for _, tc := range []struct {
		seq  uint64
		want bool
	}{
		{101, false}, {100, true}, {99, true}, {98, false}, {93, false}, {92, true}, {1, true}, {0, true},
	} {
		if got := ReplayStateSeen(100, bm, tc.seq); got != tc.want {
			t.Errorf("seq %d: %v, want %v", tc.seq, got, tc.want)
		}
	}
	if ReplayStateSeen(0, nil, 0) || ReplayStateSeen(0, nil, 5) {
		t.Error("top 0 sees numbers")
	}
	// Without a bitmap everything up to top is seen.
	if !ReplayStateSeen(100, nil, 50) || ReplayStateSeen(100, nil, 101) {
		t.Error("top without a bitmap")
	}
	// Merge on a window without ESN clamps, and an off window only
	// tracks the top.
	r := NewReplayWindow(0, true)
	r.Merge(b32+5, []byte{1})
	if r.Top() != b32+5 || r.Check(3) != nil {
		t.Error("merge into an off window")
	}
}
