package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// polyBlocks emits polyBlocks: the Poly1305 block step of RFC 8439
// section 2.5 over n bytes (a multiple of 16) of full 16-byte blocks.
// The accumulator h is h[0] + h[1]<<64 + h[2]<<128, kept below 2^131 and
// not fully reduced; r is the clamped key half. Per block it adds the
// block and 2^128, multiplies by r into four 64-bit limbs, and folds the
// bits from 2^130 up back in as 5*x = 4*x + x, since 2^130 = 5 mod p.
func polyBlocks() {
	TEXT("polyBlocks", NOSPLIT, "func(h *[3]uint64, r *[2]uint64, msg *byte, n int)")
	Pragma("noescape")
	Doc("polyBlocks runs the Poly1305 block step with key r over the n bytes of msg,",
		"n a multiple of 16, into the partly reduced accumulator h.")
	hp := Load(Param("h"), RDI)
	rp := Load(Param("r"), RAX)
	msg := Load(Param("msg"), RSI)
	n := Load(Param("n"), RCX)
	h0, h1, h2 := R8, R9, R10
	r0, r1 := R11, R12
	t0, t1, t2, t3 := R13, R14, RBX, RDI
	MOVQ(Mem{Base: rp}, r0)
	MOVQ(Mem{Base: rp, Disp: 8}, r1)
	MOVQ(Mem{Base: hp}, h0)
	MOVQ(Mem{Base: hp, Disp: 8}, h1)
	MOVQ(Mem{Base: hp, Disp: 16}, h2)
	TESTQ(n, n)
	JZ(LabelRef("done"))

	Label("block")
	ADDQ(Mem{Base: msg}, h0)
	ADCQ(Mem{Base: msg, Disp: 8}, h1)
	ADCQ(U8(1), h2)

	Comment("t = h * r: four limbs.")
	MOVQ(r0, RAX)
	MULQ(h0)
	MOVQ(RAX, t0)
	MOVQ(RDX, t1)
	MOVQ(r1, RAX)
	MULQ(h0)
	ADDQ(RAX, t1)
	ADCQ(U8(0), RDX)
	MOVQ(RDX, t2)
	MOVQ(r0, RAX)
	MULQ(h1)
	ADDQ(RAX, t1)
	ADCQ(RDX, t2)
	MOVQ(r1, RAX)
	MULQ(h1)
	ADDQ(RAX, t2)
	ADCQ(U8(0), RDX)
	MOVQ(RDX, t3)
	MOVQ(r0, RAX)
	IMULQ(h2, RAX)
	ADDQ(RAX, t2)
	ADCQ(U8(0), t3)
	MOVQ(r1, RAX)
	IMULQ(h2, RAX)
	ADDQ(RAX, t3)

	Comment("h = t mod 2^130 + 4*(t>>130) + (t>>130).")
	MOVQ(t0, h0)
	MOVQ(t1, h1)
	MOVQ(t2, h2)
	ANDQ(U8(3), h2)
	MOVQ(t2, RAX)
	ANDQ(I8(-4), RAX)
	ADDQ(RAX, h0)
	ADCQ(t3, h1)
	ADCQ(U8(0), h2)
	SHRQ(U8(2), t3, RAX)
	SHRQ(U8(2), t3)
	ADDQ(RAX, h0)
	ADCQ(t3, h1)
	ADCQ(U8(0), h2)

	ADDQ(U8(16), msg)
	SUBQ(U8(16), n)
	JNZ(LabelRef("block"))

	Label("done")
	Load(Param("h"), RAX)
	MOVQ(h0, Mem{Base: RAX})
	MOVQ(h1, Mem{Base: RAX, Disp: 8})
	MOVQ(h2, Mem{Base: RAX, Disp: 16})
	RET()
}
