// Command gen writes chachapoly_amd64.s and stub_amd64.go of package
// chachapoly with avo (go generate in the parent directory runs it). It
// is a module of its own so that avo is a dependency of this tool only,
// never of espd.
//
// The ChaCha20 function works on four blocks at a time in the vertical
// layout: register i holds word i of the four blocks' states, one block
// per 32-bit lane, so a quarter round of RFC 8439 section 2.1 is a run of
// packed adds, XORs and rotations, and the four lanes need no shuffling
// between the column and the diagonal rounds. Sixteen words and one
// scratch register do not fit in the sixteen XMM registers, so one word
// at a time lives on the stack; which one is chosen by the next use.
package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

func main() {
	ConstraintExpr("amd64,gc,!purego")
	constants()
	chachaBlocks()
	polyBlocks()
	Generate()
}

var rol16, rol8, four Mem

// constants emits the PSHUFB masks that rotate every 32-bit lane left by
// 16 and 8 bits and the counter step of one iteration.
func constants() {
	rol16 = GLOBL("rol16", RODATA|NOPTR)
	DATA(0, U64(0x0504070601000302))
	DATA(8, U64(0x0d0c0f0e09080b0a))
	rol8 = GLOBL("rol8", RODATA|NOPTR)
	DATA(0, U64(0x0605040702010003))
	DATA(8, U64(0x0e0d0c0f0a09080b))
	four = GLOBL("four", RODATA|NOPTR)
	for i := 0; i < 4; i++ {
		DATA(4*i, U32(4))
	}
}

// quarter rounds of one double round: the columns, then the diagonals.
var doubleRound = [8][4]int{
	{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15},
	{0, 5, 10, 15}, {1, 6, 11, 12}, {2, 7, 8, 13}, {3, 4, 9, 14},
}

// alloc keeps fifteen of the sixteen state words in registers and the
// other in its stack slot.
type alloc struct {
	reg     [16]VecPhysical // reg[w] holds word w unless w == spilled
	spilled int
	free    VecPhysical // the scratch register
	slot    func(w int) Mem
	sched   [][4]int // quarter rounds still to run, the current first
}

// need makes the words of the current quarter round resident, evicting
// the resident word whose next use is the farthest.
func (a *alloc) need(ws [4]int) {
	in := func(w int) bool { return w == ws[0] || w == ws[1] || w == ws[2] || w == ws[3] }
	if !in(a.spilled) {
		return
	}
	victim, far := -1, -1
	for w := 0; w < 16; w++ {
		if w == a.spilled || in(w) {
			continue
		}
		next := len(a.sched)
		for i, qr := range a.sched {
			if qr[0] == w || qr[1] == w || qr[2] == w || qr[3] == w {
				next = i
				break
			}
		}
		if next > far {
			victim, far = w, next
		}
	}
	r := a.reg[victim]
	MOVO(r, a.slot(victim))
	MOVO(a.slot(a.spilled), r)
	a.reg[a.spilled] = r
	a.spilled = victim
}

// rotate rotates every lane of x left by n bits with t as scratch.
func rotate(x, t VecPhysical, n int) {
	switch n {
	case 16:
		PSHUFB(rol16, x)
	case 8:
		PSHUFB(rol8, x)
	default:
		MOVO(x, t)
		PSLLL(U8(n), x)
		PSRLL(U8(32-n), t)
		PXOR(t, x)
	}
}

// quarter emits the quarter round of RFC 8439 section 2.1 on four lanes.
func (a *alloc) quarter(ws [4]int) {
	a.need(ws)
	x, y, z, w := a.reg[ws[0]], a.reg[ws[1]], a.reg[ws[2]], a.reg[ws[3]]
	t := a.free
	PADDL(y, x)
	PXOR(x, w)
	rotate(w, t, 16)
	PADDL(w, z)
	PXOR(z, y)
	rotate(y, t, 12)
	PADDL(y, x)
	PXOR(x, w)
	rotate(w, t, 8)
	PADDL(w, z)
	PXOR(z, y)
	rotate(y, t, 7)
}

// chachaBlocks emits blocksHash: XOR n bytes of src (n a positive
// multiple of 256) with the ChaCha20 key stream into dst, four blocks per
// iteration, lane i starting at counter ctr[i] and each lane's counter
// advancing by four per iteration (state[12] is not read), and run the
// Poly1305 block step over 256 bytes from hp in each iteration, its
// scalar instructions spread among the rounds so that the integer units
// work while the vector units do. It is the only ChaCha20 function, so
// that its code stays in the CPU's decoded-instruction cache; a caller
// that has nothing to hash points h at a scratch accumulator.
func chachaBlocks() {
	TEXT("blocksHash", NOSPLIT, "func(state *[16]uint32, ctr *[4]uint32, dst, src *byte, n int, h *[3]uint64, r *[2]uint64, hp *byte, hibit *[16]uint64, next *byte)")
	Pragma("noescape")
	Doc("blocksHash XORs n bytes of src, n a positive multiple of 256, with the ChaCha20 key",
		"stream of state into dst, which may be src. Lane i of the first four blocks has",
		"counter ctr[i]; each lane's counter then advances by 4. It ignores state[12].",
		"It also runs the Poly1305 block step with key r into h over 256 bytes per iteration,",
		"each read before that iteration writes dst: the first iteration's from hp, block i",
		"with hibit[i]<<128 added, the next ones' from next on, with 2^128 added.")
	// base: 16-byte aligned area of the sixteen initial words (orig),
	// the spill and output slots of the sixteen words, the byte count and
	// the Poly1305 key.
	frame := AllocLocal(512 + 32 + 128 + 16)
	base := RCX
	LEAQ(frame, base)
	ADDQ(U8(15), base)
	ANDQ(I32(-16), base)
	f := &iteration{
		orig: func(w int) Mem { return Mem{Base: base, Disp: 16 * w} },
		slot: func(w int) Mem { return Mem{Base: base, Disp: 256 + 16*w} },
		n:    Mem{Base: base, Disp: 512},
	}
	r0, r1 := Mem{Base: base, Disp: 520}, Mem{Base: base, Disp: 528}
	f.next = Mem{Base: base, Disp: 536}
	f.hibit = func(i int) Mem { return Mem{Base: base, Disp: 544 + 8*i} }

	Comment("Broadcast each state word to the four lanes; word 12 is the lanes' counters.")
	st := Load(Param("state"), RAX)
	for row := 0; row < 4; row++ {
		MOVOU(Mem{Base: st, Disp: 16 * row}, X0)
		for i := 0; i < 4; i++ {
			if w := 4*row + i; w != 12 {
				PSHUFL(U8(0x55*i), X0, X1)
				MOVO(X1, f.orig(w))
			}
		}
	}
	ctr := Load(Param("ctr"), RAX)
	MOVOU(Mem{Base: ctr}, X0)
	MOVO(X0, f.orig(12))
	Load(Param("n"), RAX)
	MOVQ(RAX, f.n)
	f.dst = Load(Param("dst"), RDI)
	f.src = Load(Param("src"), RSI)

	{
		rp := Load(Param("r"), RAX)
		MOVQ(Mem{Base: rp}, RDX)
		MOVQ(RDX, r0)
		MOVQ(Mem{Base: rp, Disp: 8}, RDX)
		MOVQ(RDX, r1)
		hb := Load(Param("hibit"), RAX)
		for i := 0; i < 16; i++ {
			MOVQ(Mem{Base: hb, Disp: 8 * i}, RDX)
			MOVQ(RDX, f.hibit(i))
		}
		Load(Param("next"), RAX)
		MOVQ(RAX, f.next)
		f.hp = Load(Param("hp"), RBX)
		f.poly = &poly{h0: R8, h1: R9, h2: R10, t0: R11, t1: R12, t2: R13, t3: R14, r0: r0, r1: r1}
		f.poly.load(Load(Param("h"), RAX))
	}
	Label("loop")
	f.emit(16)
	JNZ(LabelRef("loop"))
	f.poly.store(Load(Param("h"), RAX))
	RET()
}

// iteration holds what one loop iteration works with.
type iteration struct {
	orig, slot func(w int) Mem
	n          Mem
	dst, src   Register
	hp         Register
	next       Mem             // where hp goes after this iteration
	hibit      func(i int) Mem // 2^128 multiple of block i, 1 after the first iteration
	poly       *poly
}

// emit emits one iteration, with the Poly1305 step of hashBlocks blocks
// from hp, and leaves the flags of the byte count's decrement.
func (f *iteration) emit(hashBlocks int) {
	orig, slot := f.orig, f.slot
	a := &alloc{spilled: 15, free: X15, slot: slot}
	xs := []VecPhysical{X0, X1, X2, X3, X4, X5, X6, X7, X8, X9, X10, X11, X12, X13, X14}
	for w := 0; w < 15; w++ {
		a.reg[w] = xs[w]
		MOVO(orig(w), xs[w])
	}
	MOVO(orig(15), X15)
	MOVO(X15, slot(15))
	for i := 0; i < 10; i++ {
		a.sched = append(a.sched, doubleRound[:]...)
	}
	var pending []func()
	for blk := 0; blk < hashBlocks; blk++ {
		pending = append(pending, f.poly.block(Mem{Base: f.hp, Disp: 16 * blk}, f.hibit(blk))...)
	}
	Comment("Twenty rounds, unrolled.")
	for len(a.sched) > 0 {
		a.quarter(a.sched[0])
		// Spread the Poly1305 instructions evenly over the quarter rounds.
		k := (len(pending) + len(a.sched) - 1) / len(a.sched)
		for _, op := range pending[:k] {
			op()
		}
		pending = pending[k:]
		a.sched = a.sched[1:]
	}
	MOVQ(f.next, f.hp)
	ADDQ(U32(256), f.next)
	for i := 0; i < 16; i++ {
		MOVQ(U32(1), f.hibit(i))
	}

	Comment("Add the initial state and store the words.")
	for w := 0; w < 16; w++ {
		r := a.free
		if w == a.spilled {
			MOVO(slot(w), r)
		} else {
			r = a.reg[w]
		}
		PADDL(orig(w), r)
		MOVO(r, slot(w))
	}

	Comment("Transpose each group of four words to the four blocks and XOR.")
	for g := 0; g < 4; g++ {
		for i, x := range []VecPhysical{X0, X1, X2, X3} {
			MOVO(slot(4*g+i), x)
		}
		// X0..X3 hold words 4g..4g+3 of blocks 0..3 (a, b, c, d).
		MOVO(X0, X4)
		PUNPCKLLQ(X1, X4) // a0 b0 a1 b1
		PUNPCKHLQ(X1, X0) // a2 b2 a3 b3
		MOVO(X2, X5)
		PUNPCKLLQ(X3, X5) // c0 d0 c1 d1
		PUNPCKHLQ(X3, X2) // c2 d2 c3 d3
		MOVO(X4, X1)
		PUNPCKLQDQ(X5, X1) // block 0
		PUNPCKHQDQ(X5, X4) // block 1
		MOVO(X0, X3)
		PUNPCKLQDQ(X2, X3) // block 2
		PUNPCKHQDQ(X2, X0) // block 3
		for j, x := range []VecPhysical{X1, X4, X3, X0} {
			off := 64*j + 16*g
			MOVOU(Mem{Base: f.src, Disp: off}, X6)
			PXOR(X6, x)
			MOVOU(x, Mem{Base: f.dst, Disp: off})
		}
	}

	MOVO(orig(12), X0)
	PADDL(four, X0)
	MOVO(X0, orig(12))
	ADDQ(U32(256), f.src)
	ADDQ(U32(256), f.dst)
	SUBQ(U32(256), f.n)
}
