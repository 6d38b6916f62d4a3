package router

import "bytes"

// Responses put their usage near the end: OpenAI's chat completions and
// embeddings end with it, vLLM's ChatCompletionResponse follows it with
// prompt_logprobs and kv_transfer_params (v0.9, vllm/entrypoints/openai/
// protocol.py; later versions add prompt_token_ids), the responses API
// with user and metadata (the fixture openai-openapi/
// responses.response.json), and llm-d's simulator puts it just before its
// choices. Reading a response forwards to find it costs time in
// proportion to everything before it, reading it backwards from the
// closing brace in proportion to what follows it, so tailField reads the
// last few members backwards and lateField falls back to the forward
// reader only when the usage is not among them. BenchmarkParseUsage, on a
// vLLM response with a 256-byte answer: 503 ns forwards, 273 backwards;
// with a 32 KB answer 894 and 267 (session 56, benchstat over eight
// runs). The gateway's user-space instructions per 1 KB request
// (benchmarks/overhead/instructions.sh): 108,761 before, 104,195 after.

// tailMembers is how many of an object's last members tailField reads.
const tailMembers = 6

// lateField returns the span of the value of the last top-level key in
// the JSON object obj, the one encoding/json keeps, or ok false if obj has
// none or is not an object: by tailField when key is among the last
// tailMembers members (or obj has no more members than that), otherwise by
// lastField, which reads the whole object.
func lateField(obj []byte, key string) (v0, v1 int, ok bool) {
	if v0, v1, found, sure := tailField(obj, key); sure {
		return v0, v1, found
	}
	return lastField(obj, key)
}

// tailField reads the JSON object obj backwards from its closing brace,
// member by member, for at most tailMembers members. It returns the span
// of the value of the last member named key with sure true, or found false
// and sure true when it read every member and none is named key. It
// returns sure false when it cannot tell: key is not among the last
// tailMembers, a key it passes has escapes (which only a forward reader
// decodes), or the text does not read as the end of an object.
//
// Reading backwards trusts what it passes to be JSON: it matches brackets
// and string quotes but does not check literals, numbers or escapes, and
// it does not read the members before key at all, so it may find the key
// in a body that a forward reader would reject as malformed earlier on.
// For a valid object it agrees with lastField (FuzzTailField checks that).
func tailField(obj []byte, key string) (v0, v1 int, found, sure bool) {
	open := skipBlanks(obj, 0)
	if open == len(obj) || obj[open] != '{' {
		return 0, 0, false, false
	}
	i := trimBlanks(obj, len(obj)) // > open: obj[open] is '{'
	if obj[i-1] != '}' {
		return 0, 0, false, false
	}
	i = trimBlanks(obj, i-1)
	if i == open+1 {
		return 0, 0, false, true // {}
	}
	for range tailMembers {
		end := i
		start := valueStart(obj, end)
		if start <= open {
			return 0, 0, false, false
		}
		i = trimBlanks(obj, start)
		if obj[i-1] != ':' {
			return 0, 0, false, false
		}
		i = trimBlanks(obj, i-1)
		if obj[i-1] != '"' {
			return 0, 0, false, false
		}
		q := stringStart(obj, i-1)
		if q < 0 {
			return 0, 0, false, false
		}
		k := obj[q+1 : i-1]
		if bytes.IndexByte(k, '\\') >= 0 {
			return 0, 0, false, false
		}
		if string(k) == key {
			return start, end, true, true
		}
		i = trimBlanks(obj, q)
		switch {
		case i-1 == open:
			return 0, 0, false, true
		case obj[i-1] != ',':
			return 0, 0, false, false
		}
		i = trimBlanks(obj, i-1)
	}
	return 0, 0, false, false
}

// trimBlanks returns the offset just after the last byte of b before i
// that is not JSON whitespace, or 0.
func trimBlanks(b []byte, i int) int {
	for i > 0 {
		switch b[i-1] {
		case ' ', '\n', '\r', '\t':
			i--
		default:
			return i
		}
	}
	return 0
}

// valueStart returns the offset of the first byte of the JSON value that
// ends just before end (> 0), read backwards, or -1 when there is none: a
// string from its closing quote, an object or array by matching brackets
// (and skipping the strings inside, whose brackets do not count), a
// literal or number as the run of the bytes that spell them.
func valueStart(b []byte, end int) int {
	switch c := b[end-1]; c {
	case '"':
		return stringStart(b, end-1)
	case '}', ']':
		depth := 0
		for i := end - 1; i >= 0; i-- {
			switch b[i] {
			case '}', ']':
				depth++
			case '{', '[':
				depth--
				if depth == 0 {
					if (b[i] == '{') != (c == '}') {
						return -1
					}
					return i
				}
			case '"':
				if i = stringStart(b, i); i < 0 {
					return -1
				}
			}
		}
		return -1
	default:
		i := end
		for i > 0 && isLiteralByte(b[i-1]) {
			i--
		}
		if i == end {
			return -1
		}
		return i
	}
}

// isLiteralByte reports whether c may appear in a JSON number or in true,
// false and null.
func isLiteralByte(c byte) bool {
	return isDigit(c) || 'a' <= c && c <= 'z' || c == '-' || c == '+' || c == '.' || c == 'E'
}

// stringStart returns the offset of the opening quote of the JSON string
// whose closing quote is b[q], or -1. In JSON a quote inside a string is
// escaped, so the opening one is the nearest quote before q that follows
// an even number of backslashes (none, or escaped backslashes).
func stringStart(b []byte, q int) int {
	for {
		q = bytes.LastIndexByte(b[:q], '"')
		if q < 0 {
			return -1
		}
		n := 0
		for j := q - 1; j >= 0 && b[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return q
		}
	}
}
