//go:build !amd64 || purego

package prefix

// hashBlocks64 appends to dst the chained hashes of the 64-byte blocks of
// b: hashBlocks64Generic, on platforms without an assembly loop.
func hashBlocks64(dst []uint64, prev uint64, b []byte) ([]uint64, uint64) {
	return hashBlocks64Generic(dst, prev, b)
}
