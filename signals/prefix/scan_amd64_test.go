//go:build !purego

package prefix

import (
	"bytes"
	"testing"
)

// TestScanCopy checks the assembly scan at every length up to three chunks
// and every position of a quote or a backslash in it: the index returned,
// the bytes copied, and nothing written past len(src).
func TestScanCopy(t *testing.T) {
	for n := 0; n <= 50; n++ {
		for at := -1; at < n; at++ { // -1: neither character
			for _, c := range []byte{'"', '\\'} {
				src := make([]byte, n)
				for i := range src {
					src[i] = byte('a' + i%26)
				}
				want := n
				if at >= 0 {
					src[at] = c
					want = at
					if at+3 < n { // a later special byte must not matter
						src[at+3] = '"'
					}
				}
				dst := bytes.Repeat([]byte{0xee}, n+32)
				got := scanCopy(dst[:n], src)
				if got != want {
					t.Fatalf("len %d, %q at %d: index %d, want %d", n, c, at, got, want)
				}
				if !bytes.Equal(dst[:got], src[:got]) {
					t.Fatalf("len %d, %q at %d: copied %q, want %q", n, c, at, dst[:got], src[:got])
				}
				if !bytes.Equal(dst[n:], bytes.Repeat([]byte{0xee}, 32)) {
					t.Fatalf("len %d, %q at %d: wrote past len(src): %x", n, c, at, dst[n:])
				}
			}
		}
	}
}

// TestScanCopyShortDst checks that scanCopy refuses a dst shorter than
// src rather than write past it.
func TestScanCopyShortDst(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for a dst shorter than src")
		}
	}()
	scanCopy(make([]byte, 3), make([]byte, 40))
}
