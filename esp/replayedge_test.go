package esp

import (
	"math/rand/v2"
	"testing"
	"time"
)

// edgeSizes are the window sizes the extreme-value tests use.
var edgeSizes = []uint32{0, 32, 64, 128, 65536}

// edgeNumbers are the sequence numbers where arithmetic on them wraps.
var edgeNumbers = []uint64{0, 1, b32 - 2, b32 - 1, b32, 1<<64 - 2, 1<<64 - 1}

// hangBound is how long one window operation may take before a test
// reports it as hung: far above any real duration, even under -race.
const hangBound = 10 * time.Second

// bounded runs f in a goroutine and fails the test if f has not returned
// within hangBound: a hang detector, not a speed assertion. f reports its
// findings with t.Errorf.
func bounded(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(hangBound):
		t.Fatalf("%s has not returned after %v: it hangs", what, hangBound)
	}
}

// replayModel is the reference for Merge: the documented rules written
// as a predicate over a set of refused numbers, without a ring of bits.
type replayModel struct {
	size     uint64 // the window's size after rounding; 0: off
	esn      bool
	top      uint64
	recorded map[uint64]bool // numbers Update took
	merged   []mergedState   // replay states given to Merge
}

type mergedState struct {
	top    uint64
	bitmap []byte
}

// sees is ReplayStateSeen as docs/control-protocol.md section 6.2 states
// it: top itself, and every number below it except those whose bit (i
// for top-i) is clear; numbers the bitmap does not cover are seen.
func (m mergedState) sees(q uint64) bool {
	if q == 0 || q > m.top {
		return false
	}
	i := m.top - q
	return i == 0 || i/8 >= uint64(len(m.bitmap)) || m.bitmap[i/8]>>(i%8)&1 != 0
}

func newReplayModel(r *ReplayWindow) *replayModel {
	return &replayModel{size: uint64(r.Size()), esn: r.ESN(), recorded: map[uint64]bool{}}
}

// refused reports whether the window must refuse q: 0 always; with the
// window on, everything below it, and within it whatever was recorded or
// seen by a merged state (the union).
func (m *replayModel) refused(q uint64) bool {
	if q == 0 {
		return true
	}
	if m.size == 0 || q > m.top {
		return false
	}
	if m.top-q >= m.size || m.recorded[q] {
		return true
	}
	for _, s := range m.merged {
		if s.sees(q) {
			return true
		}
	}
	return false
}

func (m *replayModel) update(q uint64) bool {
	if m.refused(q) {
		return false
	}
	m.recorded[q] = true
	m.top = max(m.top, q)
	return true
}

func (m *replayModel) merge(top uint64, bitmap []byte) {
	if top == 0 {
		return
	}
	if !m.esn {
		top = min(top, b32-1)
	}
	m.merged = append(m.merged, mergedState{top, bitmap})
	m.top = max(m.top, top)
}

// probes returns the numbers worth checking around the given ones: the
// edges of a window of size around each, the wrap points, all of a
// small window and a sample of a large one.
func probes(rng *rand.Rand, size uint64, top uint64, around ...uint64) []uint64 {
	ps := append([]uint64(nil), edgeNumbers...)
	for _, x := range append(around, top) {
		for _, d := range []uint64{0, 1, 2, 7, 8, 9, 63, 64, 65, size - 2, size - 1, size, size + 1} {
			ps = append(ps, x-d, x+d)
		}
	}
	if size <= 128 {
		for i := range size + 2 {
			ps = append(ps, top-i)
		}
	} else {
		for range 64 {
			ps = append(ps, top-rng.Uint64N(size+2))
		}
	}
	return ps
}

// checkModel compares the window with the model at the probes.
func checkModel(t *testing.T, what string, r *ReplayWindow, m *replayModel, ps []uint64) {
	t.Helper()
	if r.Top() != m.top {
		t.Errorf("%s: top %#x, model %#x", what, r.Top(), m.top)
		return
	}
	for _, q := range ps {
		if got, want := r.Check(q) != nil, m.refused(q); got != want {
			t.Errorf("%s: %#x refused %v, model %v (top %#x)", what, q, got, want, m.top)
			return
		}
	}
}

// FuzzReplayMerge drives Update and Merge with any numbers, window size
// and ESN, and checks the window against replayModel after each step:
// the top, what is refused (the union of the window and each merged
// state), and that nothing refused before a merge is accepted after it.
// Its seeds are the numbers where arithmetic wraps (0, 1, 2^32-2 to 2^32,
// 2^64-2, 2^64-1) and the window's edges around them, for every window
// size of edgeSizes with ESN on and off; each case must return within
// hangBound.
func FuzzReplayMerge(f *testing.F) {
	var bms [][]byte
	for _, size := range edgeSizes {
		full := make([]byte, (size+63)&^63/8)
		for i := range full {
			full[i] = 0x5a
		}
		bms = append(bms, full)
	}
	k := 0
	for si, size := range edgeSizes {
		s := uint64(NewReplayWindow(size, false).Size())
		for _, esn := range []bool{false, true} {
			for i, a := range edgeNumbers {
				tops := append([]uint64(nil), edgeNumbers...)
				tops = append(tops, a-(s-1), a-s, a-(s+1), a+s-1, a+s, a+s+1)
				for j, t1 := range tops {
					k++
					bm := [][]byte{nil, {0x0f}, bms[si]}[k%3]
					f.Add(uint8(si), esn, a, t1, t1-1, edgeNumbers[(i+j)%len(edgeNumbers)], bm)
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, sizeIdx uint8, esn bool, a, t1, b, t2 uint64, bm []byte) {
		r := NewReplayWindow(edgeSizes[int(sizeIdx)%len(edgeSizes)], esn)
		m := newReplayModel(r)
		if !esn {
			// Without ESN, Infer hands Update 32-bit numbers only.
			a, b = uint64(uint32(a)), uint64(uint32(b))
		}
		rng := rand.New(rand.NewPCG(a, t1))
		bounded(t, "Update and Merge", func() {
			for step, op := range []struct {
				merge bool
				q     uint64
				bm    []byte
			}{{false, a, nil}, {true, t1, bm}, {false, b, nil}, {true, t2, bm[len(bm)/2:]}} {
				ps := probes(rng, m.size, m.top, a, t1, b, t2, t1-uint64(len(bm))*8)
				before := map[uint64]bool{}
				for _, q := range ps {
					before[q] = r.Check(q) != nil
				}
				if op.merge {
					r.Merge(op.q, op.bm)
					m.merge(op.q, op.bm)
				} else {
					got := r.Check(op.q) == nil && r.Update(op.q) == nil
					if want := m.update(op.q); got != want {
						t.Errorf("step %d: Update(%#x) took it: %v, model %v", step, op.q, got, want)
						return
					}
				}
				checkModel(t, "after step "+string(rune('0'+step)), r, m, ps)
				for _, q := range ps {
					if before[q] && r.Check(q) == nil {
						t.Errorf("step %d: %#x was refused before and is accepted after", step, q)
						return
					}
				}
			}
			// What Bitmap reads back is the state: a fresh window given
			// it refuses the same numbers.
			n := NewReplayWindow(r.Size(), esn)
			n.Merge(r.Top(), r.Bitmap())
			checkModel(t, "bitmap round trip", n, m, probes(rng, m.size, m.top))
		})
	})
}

// TestReplayMergeTopMax is issue 19's hang: a replay-seq of 2^64-1 on an
// ESN state made Merge count up to 2^64 (its loop's condition never went
// false) and espd stop answering.
func TestReplayMergeTopMax(t *testing.T) {
	for _, size := range edgeSizes {
		r := NewReplayWindow(size, true)
		bounded(t, "Merge(2^64-1)", func() { r.Merge(1<<64-1, nil) })
		if r.Top() != 1<<64-1 {
			t.Errorf("size %d: top %#x", size, r.Top())
		}
		if size > 0 && (r.Check(1<<64-1) == nil || r.Check(1<<64-2) == nil) {
			t.Errorf("size %d: the given top and what lies below it are accepted", size)
		}
	}
}

// TestReplayContinueExtremes carries windows whose top is at a wrap point
// into windows of every size and ESN setting: Continue returns, and the
// new window refuses what the old one did (everything below its own
// window, and all of a 32-bit space it could not carry).
func TestReplayContinueExtremes(t *testing.T) {
	for _, oldSize := range edgeSizes {
		for _, top := range edgeNumbers {
			old := NewReplayWindow(oldSize, true)
			old.Update(top)
			old.Update(top - 2)
			for _, size := range edgeSizes {
				for _, esn := range []bool{false, true} {
					r := NewReplayWindow(size, esn)
					var ok bool
					bounded(t, "Continue", func() { ok = r.Continue(old) })
					wantOK := esn || old.Top() <= b32-1
					if ok != wantOK {
						t.Fatalf("old size %d top %#x into size %d esn %v: ok %v", oldSize, old.Top(), size, esn, ok)
					}
					nt := old.Top()
					if !ok {
						nt = b32 - 1
					}
					if r.Top() != nt {
						t.Fatalf("top %#x, want %#x", r.Top(), nt)
					}
					w := uint64(r.Size())
					for _, q := range []uint64{nt + 1, nt, nt - 1, nt - 2, nt - 3, nt - w + 1, nt - w, 1, 0} {
						want := q == 0
						if w > 0 && q != 0 && q <= nt {
							// A window that was off may have taken any number.
							want = nt-q >= w || !ok || old.Size() == 0 || old.Check(q) != nil
						}
						if got := r.Check(q) != nil; got != want {
							t.Fatalf("old size %d top %#x into size %d esn %v: %#x refused %v, want %v", oldSize, top, size, esn, q, got, want)
						}
					}
				}
			}
		}
	}
}
