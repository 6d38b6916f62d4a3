//go:build !purego

package prefix

// hashBlocks64Asm hashes len(out) 64-byte blocks of b into out, chained
// from prev, and returns the last hash (prev when out is empty): exactly
// hashBlocks64Generic's hashes. b must hold at least 64·len(out) bytes.
// It is written in assembly (hash_amd64.s).
//
//go:noescape
func hashBlocks64Asm(out []uint64, prev uint64, b []byte) uint64

// hashBlocks64 appends to dst the chained hashes of the 64-byte blocks of
// b, as hashBlocks64Generic does, with the loop in assembly.
func hashBlocks64(dst []uint64, prev uint64, b []byte) ([]uint64, uint64) {
	n, m := len(dst), len(b)/64
	out := dst[n : n+m]
	prev = hashBlocks64Asm(out, prev, b[:m*64])
	return dst[:n+m], prev
}
