package router

import (
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf8"

	"github.com/inferroute/inferroute/signals/prefix"
)

// errSyntax is wrapped with the byte offset when a body has data after its
// object.
var errSyntax = errors.New("malformed JSON")

// stringValue returns the Go string of the JSON string literal v (with its
// quotes), as encoding/json decodes it, or ok false if v is not a valid
// string: one with a raw control character, say. Invalid UTF-8 becomes
// U+FFFD.
func stringValue(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	if inner := v[1 : len(v)-1]; plainString(inner) {
		return string(inner), true
	}
	var out string
	if err := json.Unmarshal(v, &out); err != nil {
		return "", false
	}
	return out, true
}

// plainString reports whether s, the inside of a JSON string, needs no
// decoding: valid UTF-8 without backslashes or control characters.
func plainString(s []byte) bool {
	ascii := true
	for _, c := range s {
		if c < ' ' || c == '\\' {
			return false
		}
		if c >= utf8.RuneSelf {
			ascii = false
		}
	}
	return ascii || utf8.Valid(s)
}

// isNumber reports whether v is a JSON number (RFC 8259 section 6):
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func isNumber(v []byte) bool {
	i := 0
	if i < len(v) && v[i] == '-' {
		i++
	}
	switch {
	case i < len(v) && v[i] == '0':
		i++
	case i < len(v) && '1' <= v[i] && v[i] <= '9':
		for i++; i < len(v) && isDigit(v[i]); i++ {
		}
	default:
		return false
	}
	if i < len(v) && v[i] == '.' {
		i++
		if i == len(v) || !isDigit(v[i]) {
			return false
		}
		for ; i < len(v) && isDigit(v[i]); i++ {
		}
	}
	if i < len(v) && (v[i] == 'e' || v[i] == 'E') {
		i++
		if i < len(v) && (v[i] == '+' || v[i] == '-') {
			i++
		}
		if i == len(v) || !isDigit(v[i]) {
			return false
		}
		for ; i < len(v) && isDigit(v[i]); i++ {
		}
	}
	return i == len(v)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// intValue parses a JSON integer (or a number with a zero fraction): a
// number as RFC 8259 section 6 writes them, so not 01, 1., +1 or 0x10.
func intValue(v []byte) (int, bool) {
	if !isNumber(v) {
		return 0, false
	}
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

// lastField is findField for the last of a repeated key, the one
// encoding/json keeps: it reads the whole object.
func lastField(obj []byte, key string) (v0, v1 int, ok bool) {
	_, err := prefix.Fields(obj, func(k []byte, a, b int) error {
		if string(k) == key {
			v0, v1, ok = a, b, true
		}
		return nil
	})
	if err != nil {
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
