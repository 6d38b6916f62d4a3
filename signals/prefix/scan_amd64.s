//go:build !purego

#include "textflag.h"

// func scanCopyAsm(dst, src []byte) int
//
// Copies src into dst up to the first '"' or '\' of src and returns the
// index of that byte, or len(src) when src has neither: the copy and the
// search of a JSON string's run of plain bytes in one pass, 16 bytes at a
// time with SSE2 (part of every amd64 CPU, so no feature check). Each
// 16-byte chunk is stored whole before it is searched, so dst may be
// written past the returned index, never past len(src): the caller must
// give len(dst) >= len(src) (the Go wrapper slices dst to len(src)).
// A src of 16 bytes or more ends on one overlapping chunk, its last 16
// bytes, which costs no masking: the bytes it shares with the chunk before
// it were searched already and hold neither character. A shorter src is
// read byte by byte.
//
// Registers: SI src, DI dst, CX len(src), AX the index, R9 the start of
// the last whole chunk, X1 sixteen quotes, X2 sixteen backslashes.

// COPY_AND_SEARCH16 copies the 16 bytes at SI+AX to DI+AX and leaves in BX
// the mask of those that are a quote or a backslash (bit i for byte i).
#define COPY_AND_SEARCH16 \
	MOVOU    (SI)(AX*1), X0; \
	MOVOU    X0, (DI)(AX*1); \
	MOVOU    X0, X3; \
	PCMPEQB  X1, X0; \
	PCMPEQB  X2, X3; \
	POR      X3, X0; \
	PMOVMSKB X0, BX

TEXT ·scanCopyAsm(SB), NOSPLIT, $0-56
	MOVQ dst_base+0(FP), DI
	MOVQ src_base+24(FP), SI
	MOVQ src_len+32(FP), CX
	XORQ AX, AX
	CMPQ CX, $16
	JB   short

	MOVQ $0x2222222222222222, DX // '"'
	MOVQ DX, X1
	PSHUFD $0, X1, X1
	MOVQ $0x5c5c5c5c5c5c5c5c, DX // '\'
	MOVQ DX, X2
	PSHUFD $0, X2, X2
	MOVQ CX, R9
	SUBQ $16, R9

chunk:
	CMPQ AX, R9
	JA   last
	COPY_AND_SEARCH16
	TESTL BX, BX
	JNZ  found
	ADDQ $16, AX
	JMP  chunk

last:
	// Fewer than 16 bytes are left (AX > len-16): search the last 16.
	CMPQ AX, CX
	JEQ  none
	MOVQ R9, AX
	COPY_AND_SEARCH16
	TESTL BX, BX
	JNZ  found

none:
	MOVQ CX, ret+48(FP)
	RET

found:
	BSFL BX, BX
	ADDQ BX, AX
	MOVQ AX, ret+48(FP)
	RET

short:
	CMPQ AX, CX
	JEQ  none
	MOVBLZX (SI)(AX*1), BX
	CMPB BL, $0x22
	JEQ  stop
	CMPB BL, $0x5c
	JEQ  stop
	MOVB BL, (DI)(AX*1)
	INCQ AX
	JMP  short

stop:
	MOVQ AX, ret+48(FP)
	RET
