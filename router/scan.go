package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/inferroute/inferroute/signals/prefix"
)

// errSyntax is wrapped with the byte offset when a body has data after its
// object.
var errSyntax = errors.New("malformed JSON")

// stringValue returns the Go string of the JSON string literal v (with its
// quotes), or ok false if v is not a string.
func stringValue(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	inner := v[1 : len(v)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner), true
	}
	var out string
	if err := json.Unmarshal(v, &out); err != nil {
		return "", false
	}
	return out, true
}

// intValue parses a JSON integer (or a number with a zero fraction).
func intValue(v []byte) (int, bool) {
	if n, err := strconv.Atoi(string(v)); err == nil {
		return n, true
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil || f != float64(int(f)) {
		return 0, false
	}
	return int(f), true
}

// findField returns the span of the value of the top-level key in the JSON
// object obj, or ok false if obj is not an object or has no such key. The
// object is read with prefix.Fields, the scanner of the prompt renderer, up
// to the key.
func findField(obj []byte, key string) (v0, v1 int, ok bool) {
	_, err := prefix.Fields(obj, func(k []byte, a, b int) error {
		if string(k) == key {
			v0, v1, ok = a, b, true
			return errFound
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) {
		return 0, 0, false
	}
	return v0, v1, ok
}

// errFound stops prefix.Fields at the key findField looks for.
var errFound = errors.New("found")

// skipBlanks returns the offset of the first byte of b at or after i that
// is not JSON whitespace.
func skipBlanks(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\n', '\r', '\t':
			i++
		default:
			return i
		}
	}
	return i
}
