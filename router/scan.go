package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// errSyntax is wrapped with the byte offset when a body is not well-formed
// JSON.
var errSyntax = errors.New("malformed JSON")

// maxDepth bounds JSON nesting so that a hostile body cannot exhaust the
// stack.
const maxDepth = 256

// scanner walks a JSON document without building values: it finds the
// top-level keys it is asked about and skips everything else. Skipping a
// string jumps between quote characters with bytes.IndexByte, so the cost of
// a body is one pass over its bytes with no allocation.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) errAt() error { return fmt.Errorf("%w at byte %d", errSyntax, s.i) }

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\n', '\r', '\t':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str reads a string starting at the opening quote and returns the span of
// its contents, without the quotes.
func (s *scanner) str() (start, end int, ok bool) {
	if !s.eat('"') {
		return 0, 0, false
	}
	start = s.i
	for {
		j := bytes.IndexByte(s.b[s.i:], '"')
		if j < 0 {
			s.i = len(s.b)
			return 0, 0, false
		}
		q := s.i + j
		// The quote ends the string unless an odd number of backslashes
		// precedes it. Raw control characters are not rejected: checking
		// them would cost a second pass, and the model server rejects such a
		// body anyway; the structure is what routing depends on.
		n := 0
		for k := q - 1; k >= start && s.b[k] == '\\'; k-- {
			n++
		}
		s.i = q + 1
		if n%2 == 0 {
			return start, q, true
		}
	}
}

// skip skips one JSON value of any kind.
func (s *scanner) skip(depth int) bool {
	if depth > maxDepth || s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, _, ok := s.str()
		return ok
	case c == '{':
		s.i++
		s.ws()
		if s.eat('}') {
			return true
		}
		for {
			s.ws()
			if _, _, ok := s.str(); !ok {
				return false
			}
			s.ws()
			if !s.eat(':') {
				return false
			}
			s.ws()
			if !s.skip(depth + 1) {
				return false
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			return s.eat('}')
		}
	case c == '[':
		s.i++
		s.ws()
		if s.eat(']') {
			return true
		}
		for {
			s.ws()
			if !s.skip(depth + 1) {
				return false
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			return s.eat(']')
		}
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	case c == '-' || (c >= '0' && c <= '9'):
		j := s.i + 1
		for j < len(s.b) {
			d := s.b[j]
			if (d >= '0' && d <= '9') || d == '.' || d == 'e' || d == 'E' || d == '+' || d == '-' {
				j++
				continue
			}
			break
		}
		s.i = j
		return true
	}
	return false
}

func (s *scanner) lit(w string) bool {
	if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
		s.i += len(w)
		return true
	}
	return false
}

// objectFields calls f for each key of the object at the scanner's position
// with the key's raw bytes (unescaped keys are compared as written, which is
// how every OpenAI client sends them) and the span [v0, v1) of its value.
// f returns false to stop early. It returns an error if the object is
// malformed (up to where it was read).
func (s *scanner) objectFields(f func(key []byte, v0, v1 int) bool) error {
	s.ws()
	if !s.eat('{') {
		return s.errAt()
	}
	s.ws()
	if s.eat('}') {
		return nil
	}
	for {
		s.ws()
		ks, ke, ok := s.str()
		if !ok {
			return s.errAt()
		}
		s.ws()
		if !s.eat(':') {
			return s.errAt()
		}
		s.ws()
		v0 := s.i
		if !s.skip(1) {
			return s.errAt()
		}
		if !f(s.b[ks:ke], v0, s.i) {
			return nil
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat('}') {
			return nil
		}
		return s.errAt()
	}
}

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
// object obj, or ok false if obj is not an object or has no such key.
func findField(obj []byte, key string) (v0, v1 int, ok bool) {
	s := scanner{b: obj}
	err := s.objectFields(func(k []byte, a, b int) bool {
		if string(k) == key {
			v0, v1, ok = a, b, true
			return false
		}
		return true
	})
	if err != nil {
		return 0, 0, false
	}
	return v0, v1, ok
}
