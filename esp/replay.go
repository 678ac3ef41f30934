package esp

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// MaxReplayWindow is the largest replay window NewReplayWindow accepts;
// larger sizes are clamped to it.
const MaxReplayWindow = 65536

// NominalInferWidth is the window width ESN inference uses when the replay
// window is off (size 0): RFC 4303 Appendix A needs a width, and 2^31
// makes it pick the high bits that put the packet nearest to the highest
// sequence number seen, tolerating any realistic reordering.
const NominalInferWidth = 1 << 31

// ReplayWindow is the anti-replay window of one inbound SA (RFC 4303
// section 3.4.3) with ESN inference (Appendix A). It is a ring of 64-bit
// words as in RFC 6479, so advancing the window clears whole words instead
// of shifting bits.
//
// Checking and recording are separate steps, as in the kernel's XFRM
// (xfrm_replay_check before decryption, xfrm_replay_advance after): Infer
// and Check are lock-free and run before decryption, so that replays cost
// no crypto; Update records a packet once it is authentic, takes a mutex
// and has the last word: it returns ErrReplay for a duplicate that passed
// Check while its twin was still being decrypted. Many goroutines may use
// one window at once. A pipeline that decrypts in parallel records from
// one in-order stage, so that the window advances in arrival order and
// inference (which starts from Top) sees the numbers in that order.
type ReplayWindow struct {
	size   uint64 // packets, a multiple of 64; 0: no replay check
	esn    bool
	mask   uint64 // len(bitmap)-1; len(bitmap) is a power of two
	top    atomic.Uint64
	mu     sync.Mutex // serialises Update
	bitmap []atomic.Uint64
}

// NewReplayWindow returns a window of size packets, rounded up to a
// multiple of 64 and clamped to MaxReplayWindow; 0 turns replay checking
// off (sequence numbers are still tracked for ESN inference). esn says
// whether the SA uses 64-bit extended sequence numbers.
func NewReplayWindow(size uint32, esn bool) *ReplayWindow {
	s := min(uint64(size), MaxReplayWindow)
	s = (s + 63) &^ 63
	r := &ReplayWindow{size: s, esn: esn}
	if s > 0 {
		// One word more than the window so that the oldest word in use is
		// never the one being cleared, rounded up to a power of two.
		words := uint64(1) << bits.Len64(s/64)
		r.mask = words - 1
		r.bitmap = make([]atomic.Uint64, words)
	}
	return r
}

// Size returns the window size in packets (after rounding).
func (r *ReplayWindow) Size() uint32 { return uint32(r.size) }

// ESN reports whether the window infers extended sequence numbers.
func (r *ReplayWindow) ESN() bool { return r.esn }

// Top returns the highest sequence number accepted so far (0: none).
func (r *ReplayWindow) Top() uint64 { return r.top.Load() }

// Infer returns the full sequence number for the 32 bits seqLo carried in
// a packet. Without ESN that is seqLo. With ESN it follows RFC 4303
// Appendix A with window width W (NominalInferWidth when the window is
// off): the high 32 bits are those of the highest sequence number seen,
// one more when seqLo lies below the window, or one less when the window
// spans a 2^32 boundary and seqLo lies in its older part. A guess that is
// wrong fails the ICV check, which covers the high bits.
// It agrees with the kernel's xfrm_replay_seqhi except where no guess
// but its own can be right (docs/dev/xfrm-interop.md, "Inferring the high
// half of an ESN").
func (r *ReplayWindow) Infer(seqLo uint32) uint64 {
	if !r.esn {
		return uint64(seqLo)
	}
	top := r.top.Load()
	th, tl := uint32(top>>32), uint32(top)
	w := uint32(NominalInferWidth)
	if r.size > 0 {
		w = uint32(r.size)
	}
	bl := tl - w + 1 // bottom of the window, modulo 2^32
	if tl >= w-1 {
		// Case A: the window lies within one 2^32 subspace.
		if seqLo >= bl || th == ^uint32(0) {
			return uint64(th)<<32 | uint64(seqLo)
		}
		return uint64(th+1)<<32 | uint64(seqLo)
	}
	// Case B: the window spans two subspaces.
	if seqLo >= bl && th > 0 {
		return uint64(th-1)<<32 | uint64(seqLo)
	}
	return uint64(th)<<32 | uint64(seqLo)
}

// Check reports whether seq may be new: it returns ErrReplay for sequence
// number 0, for one older than the window, and for one already recorded.
// Call it before decrypting; it does not change the window, so a pass is
// provisional until Update records seq.
func (r *ReplayWindow) Check(seq uint64) error {
	if seq == 0 {
		return ErrReplay
	}
	if r.size == 0 {
		return nil
	}
	top := r.top.Load()
	if seq > top {
		return nil
	}
	if top-seq >= r.size {
		return ErrReplay
	}
	// If the window moved on since top was read, this word may already
	// hold newer sequence numbers; then seq is too old for the new window
	// and rejecting it is right, while a stale pass is caught by Update.
	if r.has(seq) {
		return ErrReplay
	}
	return nil
}

// Update records seq as received, advancing the window if seq is the new
// highest. Call it once the packet is authentic (its ICV verified), and,
// where packets are decrypted in parallel, from one stage in the order the
// packets arrived. It returns ErrReplay, changing nothing, if seq is 0,
// older than the window, or already recorded: a duplicate that slipped
// through between Check and Update. With a size-0 window it only tracks
// the highest number.
func (r *ReplayWindow) Update(seq uint64) error {
	if seq == 0 {
		return ErrReplay
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	top := r.top.Load()
	if r.size == 0 {
		if seq > top {
			r.top.Store(seq)
		}
		return nil
	}
	if seq > top {
		cur, idx := top>>6, seq>>6
		// Clear the words the window slides over (all of them after a
		// jump past the ring) before publishing the new top.
		for i := range min(idx-cur, r.mask+1) {
			r.bitmap[(cur+1+i)&r.mask].Store(0)
		}
	} else if top-seq >= r.size {
		return ErrReplay
	}
	w := &r.bitmap[(seq>>6)&r.mask]
	bit := uint64(1) << (seq & 63)
	old := w.Load()
	if old&bit != 0 {
		return ErrReplay
	}
	w.Store(old | bit)
	if seq > top {
		r.top.Store(seq)
	}
	return nil
}

// Continue makes r, a window not yet in use, carry on where old stops,
// for a state that replaces old's under the same key: r gets old's
// highest sequence number, and every number old would refuse (recorded,
// or older than its window) r refuses too, whatever the two windows'
// sizes and ESN. Numbers that r's larger window covers but old's did not
// count as received: old refused them. A window without ESN cannot hold a
// highest number above 2^32-1: Continue then leaves r refusing every
// number up to 2^32-1 and returns false. Its work is bounded by r's size.
func (r *ReplayWindow) Continue(old *ReplayWindow) bool {
	old.mu.Lock()
	defer old.mu.Unlock()
	top, ok := old.top.Load(), true
	if !r.esn && top > 1<<32-1 {
		top, ok = 1<<32-1, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.top.Store(top)
	if r.size == 0 || top == 0 {
		return ok
	}
	// Offsets i from top, not numbers: top may be 2^64-1.
	for i := range min(r.size, top) {
		seq := top - i
		if !ok || old.size == 0 || i >= old.size || old.has(seq) {
			r.set(seq)
		}
	}
	return ok
}

// has reports whether the bit for seq is set. The caller checks that seq
// lies within the window.
func (r *ReplayWindow) has(seq uint64) bool {
	return r.bitmap[(seq>>6)&r.mask].Load()&(1<<(seq&63)) != 0
}

// set sets the bit for seq. Called with mu held.
func (r *ReplayWindow) set(seq uint64) {
	w := &r.bitmap[(seq>>6)&r.mask]
	w.Store(w.Load() | 1<<(seq&63))
}

// Bitmap returns which numbers of the window, counted down from Top, have
// been seen: bit i of the result (byte i/8, value 1<<(i%8)) is set when
// Top-i has been recorded, for i from 0 to Size()-1; bits for numbers
// below 1 (i >= Top) are clear. Bit 0 stands for Top itself. A window
// that is off (size 0) or has seen nothing returns nil. This is the
// layout Merge and the replay-bitmap of a state's configuration use; it
// is independent of how the window stores its bits (the kernel's bmp is
// position-based and differs).
func (r *ReplayWindow) Bitmap() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	top := r.top.Load()
	if r.size == 0 || top == 0 {
		return nil
	}
	b := make([]byte, r.size/8)
	for i := range min(r.size, top) {
		if r.has(top - i) {
			b[i/8] |= 1 << (i % 8)
		}
	}
	return b
}

// ReplayStateSeen reports whether a replay state given as top (its highest
// number seen) and bitmap (in Bitmap's layout) counts seq as seen: every
// number up to top is, except those for which a bit of bitmap other than
// bit 0 is clear. Numbers of the window that bitmap does not cover (it is
// shorter than the window, or absent) count as seen, so that a state
// given only a top refuses everything up to it; top itself is always
// seen. With top 0 nothing is.
func ReplayStateSeen(top uint64, bitmap []byte, seq uint64) bool {
	if seq > top || top == 0 {
		return false
	}
	i := top - seq
	if i == 0 || i >= uint64(len(bitmap))*8 {
		return true
	}
	return bitmap[i/8]&(1<<(i%8)) != 0
}

// Merge adds a replay state, given as top (the highest number seen) and
// bitmap (Bitmap's layout; see ReplayStateSeen for the numbers it does not
// cover), to the window: afterwards the window's highest number is the
// higher of the two tops, and every number that either the window or the
// given state refused is refused (the union; nothing refused before is
// accepted after). It is how a state is given a replay-seq and
// replay-bitmap, on a new window or one in use (concurrent Check and
// Update stay correct). top 0 changes nothing. A window without ESN takes
// top up to 2^32-1 (larger values are clamped: the caller validates them);
// bits for numbers below 1 are ignored. Its work is bounded by the
// window's size, whatever top is (2^64-1 included).
func (r *ReplayWindow) Merge(top uint64, bitmap []byte) {
	if top == 0 {
		return
	}
	if !r.esn {
		top = min(top, 1<<32-1)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.top.Load()
	nt := max(cur, top)
	if r.size == 0 {
		r.top.Store(nt)
		return
	}
	// The window after the merge holds the n numbers nt-i for offsets i
	// below n; loops run over offsets, so that their length is the
	// window's size whatever the numbers (nt may be 2^64-1).
	n := min(r.size, nt)
	// What the window refuses now, bit i for nt-i, read before any word
	// is cleared.
	var refused [MaxReplayWindow / 64]uint64
	for i := range n {
		if seq := nt - i; seq <= cur && (cur-seq >= r.size || r.has(seq)) {
			refused[i/64] |= 1 << (i % 64)
		}
	}
	if nt > cur {
		c, idx := cur>>6, nt>>6
		for i := range min(idx-c, r.mask+1) {
			r.bitmap[(c+1+i)&r.mask].Store(0)
		}
	}
	for i := range n {
		if seq := nt - i; refused[i/64]&(1<<(i%64)) != 0 || ReplayStateSeen(top, bitmap, seq) {
			r.set(seq)
		}
	}
	if nt > cur {
		r.top.Store(nt)
	}
}
