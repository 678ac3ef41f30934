package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// poly is the register assignment of the Poly1305 block step. The
// accumulator h is h0 + h1<<64 + h2<<128, kept below 2^131 and not fully
// reduced; r0 and r1 are the clamped key half (registers or memory); the
// product goes to t0..t3; MULQ takes AX and DX.
type poly struct {
	h0, h1, h2, t0, t1, t2, t3 Register
	r0, r1                     Op
}

func (p *poly) load(h Register) {
	MOVQ(Mem{Base: h}, p.h0)
	MOVQ(Mem{Base: h, Disp: 8}, p.h1)
	MOVQ(Mem{Base: h, Disp: 16}, p.h2)
}

func (p *poly) store(h Register) {
	MOVQ(p.h0, Mem{Base: h})
	MOVQ(p.h1, Mem{Base: h, Disp: 8})
	MOVQ(p.h2, Mem{Base: h, Disp: 16})
}

// block returns the instructions of one block step of RFC 8439 section
// 2.5 on the 16 bytes at m, in order: add the block and hibit<<128 (1 for
// a message block; 0 makes a zero block a no-op while h is 0), multiply
// by r into four 64-bit limbs, and fold the bits from 2^130 up back in as
// 5*x = 4*x + x, since 2^130 = 5 mod p. The caller may put vector
// instructions between them, never flag-setting ones.
func (p *poly) block(m Mem, hibit Op) []func() {
	h0, h1, h2, t0, t1, t2, t3 := p.h0, p.h1, p.h2, p.t0, p.t1, p.t2, p.t3
	r0, r1 := p.r0, p.r1
	return []func(){
		func() { ADDQ(m, h0) },
		func() { ADCQ(m.Offset(8), h1) },
		func() { ADCQ(hibit, h2) },
		// t = h * r
		func() { MOVQ(r0, RAX) },
		func() { MULQ(h0) },
		func() { MOVQ(RAX, t0) },
		func() { MOVQ(RDX, t1) },
		func() { MOVQ(r1, RAX) },
		func() { MULQ(h0) },
		func() { ADDQ(RAX, t1) },
		func() { ADCQ(U8(0), RDX) },
		func() { MOVQ(RDX, t2) },
		func() { MOVQ(r0, RAX) },
		func() { MULQ(h1) },
		func() { ADDQ(RAX, t1) },
		func() { ADCQ(RDX, t2) },
		func() { MOVQ(r1, RAX) },
		func() { MULQ(h1) },
		func() { ADDQ(RAX, t2) },
		func() { ADCQ(U8(0), RDX) },
		func() { MOVQ(RDX, t3) },
		func() { MOVQ(r0, RAX) },
		func() { IMULQ(h2, RAX) },
		func() { ADDQ(RAX, t2) },
		func() { ADCQ(U8(0), t3) },
		func() { MOVQ(r1, RAX) },
		func() { IMULQ(h2, RAX) },
		func() { ADDQ(RAX, t3) },
		// h = t mod 2^130 + 4*(t>>130) + (t>>130)
		func() { MOVQ(t0, h0) },
		func() { MOVQ(t1, h1) },
		func() { MOVQ(t2, h2) },
		func() { ANDQ(U8(3), h2) },
		func() { MOVQ(t2, RAX) },
		func() { ANDQ(I8(-4), RAX) },
		func() { ADDQ(RAX, h0) },
		func() { ADCQ(t3, h1) },
		func() { ADCQ(U8(0), h2) },
		func() { SHRQ(U8(2), t3, RAX) },
		func() { SHRQ(U8(2), t3) },
		func() { ADDQ(RAX, h0) },
		func() { ADCQ(t3, h1) },
		func() { ADCQ(U8(0), h2) },
	}
}

// polyBlocks emits polyBlocks: the Poly1305 block step over n bytes (a
// multiple of 16) of full 16-byte blocks.
func polyBlocks() {
	TEXT("polyBlocks", NOSPLIT, "func(h *[3]uint64, r *[2]uint64, msg *byte, n int)")
	Pragma("noescape")
	Doc("polyBlocks runs the Poly1305 block step with key r over the n bytes of msg,",
		"n a multiple of 16, into the partly reduced accumulator h.")
	hp := Load(Param("h"), RDI)
	rp := Load(Param("r"), RAX)
	msg := Load(Param("msg"), RSI)
	n := Load(Param("n"), RCX)
	p := &poly{h0: R8, h1: R9, h2: R10, t0: R13, t1: R14, t2: RBX, t3: RDI, r0: R11, r1: R12}
	MOVQ(Mem{Base: rp}, R11)
	MOVQ(Mem{Base: rp, Disp: 8}, R12)
	p.load(hp)
	TESTQ(n, n)
	JZ(LabelRef("done"))

	Label("block")
	for _, op := range p.block(Mem{Base: msg}, U8(1)) {
		op()
	}
	ADDQ(U8(16), msg)
	SUBQ(U8(16), n)
	JNZ(LabelRef("block"))

	Label("done")
	p.store(Load(Param("h"), RAX))
	RET()
}
