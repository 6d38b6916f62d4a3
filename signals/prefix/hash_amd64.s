//go:build !purego

#include "textflag.h"

// func hashBlocks64Asm(out []uint64, prev uint64, b []byte) uint64
//
// The loop of hashBlocks64Generic (hash.go) written out for amd64: the same
// hash of every 64-byte block, chained the same way. The compiled Go loop
// takes about 70 instructions a block, as it reloads the four 64-bit
// constants before each XOR (an XOR takes no 64-bit immediate), moves
// operands in and out of AX and DX around each MULQ, and keeps inlining
// marks; here the constants stay in registers and a block takes 41
// instructions. len(out) blocks are hashed; b holds at least 64·len(out)
// bytes (the Go wrapper guarantees it).
//
// Registers: SI b, DI out, CX blocks left, R8 the chain value, R9–R12 the
// constants p0–p3, R13 the block's fold f, AX DX BX scratch.
TEXT ·hashBlocks64Asm(SB), NOSPLIT, $0-64
	MOVQ out_base+0(FP), DI
	MOVQ out_len+8(FP), CX
	MOVQ prev+24(FP), R8
	MOVQ b_base+32(FP), SI
	TESTQ CX, CX
	JZ   done
	MOVQ $0xa0761d6478bd642f, R9  // p0
	MOVQ $0xe7037ed1a0b428db, R10 // p1
	MOVQ $0x8ebc6af09c88c6e3, R11 // p2
	MOVQ $0x589965cc75374cc3, R12 // p3

loop:
	// a = mum(w0^p1, w1^p0)
	MOVQ 0(SI), AX
	XORQ R10, AX
	MOVQ 8(SI), BX
	XORQ R9, BX
	MULQ BX
	XORQ DX, AX
	MOVQ AX, R13

	// c = mum(w2^p2, w3^p1)
	MOVQ 16(SI), AX
	XORQ R11, AX
	MOVQ 24(SI), BX
	XORQ R10, BX
	MULQ BX
	XORQ DX, R13
	XORQ AX, R13

	// d = mum(w4^p3, w5^p2)
	MOVQ 32(SI), AX
	XORQ R12, AX
	MOVQ 40(SI), BX
	XORQ R11, BX
	MULQ BX
	XORQ DX, R13
	XORQ AX, R13

	// e = mum(w6^p0, w7^p3)
	MOVQ 48(SI), AX
	XORQ R9, AX
	MOVQ 56(SI), BX
	XORQ R12, BX
	MULQ BX
	XORQ DX, R13
	XORQ AX, R13

	// f = a^c^d^e^p1^64
	XORQ R10, R13
	XORQ $64, R13

	// prev = link(prev, f) = f ^ (prev^prev>>30)*0xbf58476d1ce4e5b9
	MOVQ R8, BX
	SHRQ $30, BX
	XORQ BX, R8
	MOVQ $0xbf58476d1ce4e5b9, BX
	IMULQ BX, R8
	XORQ R13, R8

	MOVQ R8, 0(DI)
	ADDQ $64, SI
	ADDQ $8, DI
	DECQ CX
	JNZ  loop

done:
	MOVQ R8, ret+56(FP)
	RET
