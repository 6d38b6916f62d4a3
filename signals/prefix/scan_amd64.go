//go:build !purego

package prefix

import "slices"

// scanCopyAsm is scanCopy's loop in assembly (scan_amd64.s); len(dst)
// must be at least len(src).
//
//go:noescape
func scanCopyAsm(dst, src []byte) int

// scanCopy copies src into dst up to the first '"' or '\\' of src and
// returns the index of that byte, or len(src) when src has neither. It may
// write dst beyond that index, up to len(src); dst must have room for
// len(src) bytes (it panics otherwise).
func scanCopy(dst, src []byte) int {
	return scanCopyAsm(dst[:len(src)], src)
}

// appendString is appendStringGeneric's contract with one pass over each
// run of plain bytes: scanCopy finds the run's end (a quote or a
// backslash) and copies it at once, where the generic version searches
// for the quote and for the backslash separately and then copies. In a
// string of real prompt text, a newline or a quote escaped every few dozen
// bytes, that is one call per escape instead of up to three.
func appendString(dst, b []byte, i int) ([]byte, int, bool) {
	// The decoded string is never longer than its raw form, so room for
	// the rest of b keeps every write in place, scanCopy's included: out
	// has room for len(b)-j bytes at n at every step, as a copy advances n
	// and j alike and an escape advances n less than j.
	dst = slices.Grow(dst, len(b)-i)
	n := len(dst)
	out := dst[:cap(dst)]
	j := i + 1
	for {
		k := scanCopy(out[n:], b[j:])
		n += k
		j += k
		if j == len(b) {
			return dst, i, false
		}
		if b[j] == '"' {
			return out[:n], j + 1, true
		}
		if j+1 < len(b) {
			if d := unescaped[b[j+1]]; d != 0 {
				out[n] = d
				n++
				j += 2
				continue
			}
		}
		var ok bool
		if n, j, ok = unescapeU(out, n, b, j); !ok {
			return dst, i, false
		}
	}
}
