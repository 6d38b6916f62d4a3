package prefix

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// BytesPerToken is the number of rendered bytes HashBody counts per token id
// when a prompt is given as token ids, so that promptBytes/BytesPerToken
// estimates the prompt's tokens whatever its form.
const BytesPerToken = 4

// ErrBadBody is returned, wrapped in a *SyntaxError with the byte offset,
// by HashBody, Fields and Prompt.Read when the request body is not
// well-formed JSON or its prompt fields have the wrong shape.
var ErrBadBody = errors.New("prefix: malformed request body")

// SyntaxError is the error HashBody, Fields and Prompt.Read return for a
// malformed body: Offset is the byte of the body at which reading stopped.
// It wraps ErrBadBody, so errors.Is(err, ErrBadBody) holds for it; callers
// that show the error to a client can take the offset from it instead of
// this package's message.
type SyntaxError struct {
	Offset int
}

// Error returns ErrBadBody's message with the offset.
func (e *SyntaxError) Error() string { return fmt.Sprintf("%v at byte %d", ErrBadBody, e.Offset) }

// Unwrap returns ErrBadBody.
func (e *SyntaxError) Unwrap() error { return ErrBadBody }

// maxDepth bounds JSON nesting so that a hostile body cannot exhaust the
// stack.
const maxDepth = 256

// Separators of the rendered prompt: ASCII record, unit and group
// separators, which do not occur in ordinary prompt text.
const (
	sepMessage = 0x1e // before each message: role follows
	sepField   = 0x1f // after the role and the name
	sepPart    = 0x1d // before a structured part (tool calls, non-text content)
)

// maxPooledText is the largest rendered-text buffer a pooled Prompt keeps.
const maxPooledText = 8 << 20

// HashBody renders the prompt of an OpenAI-style JSON request body and
// appends its chained block hashes to dst, like HashText on the rendered
// text or HashTokens on the body's token ids. It returns the extended slice,
// the rendered prompt length in bytes (BytesPerToken per token for token-id
// prompts; every prompt of a batch counted), and ErrBadBody (wrapped) for a
// malformed body, in which case dst is returned unchanged.
//
// Recognised fields, wherever they appear in the object:
//   - chat completions: "tools" (rendered first, as their raw JSON), then
//     "messages": each message renders as its role, name, content (a string,
//     or the text parts of a content array; other parts such as images as
//     their raw JSON, so a different image is a different prefix), tool calls
//     and tool_call_id, in that order whatever the key order of the body;
//   - completions "prompt": a string renders as itself, so HashBody of
//     {"prompt":"…"} equals HashText of the string; an array of strings or of
//     token-id arrays is a batch, of which the first prompt is hashed; an
//     array of numbers is hashed as token ids;
//   - /v1/responses and /v1/embeddings "input", like "prompt" when it is a
//     string or ids, or as messages when it is an array of items; the
//     responses "instructions" render as a leading system message.
//
// Of a repeated key the last value stands, as encoding/json and the
// servers' readers take it, even when it is null. A body with none of
// these fields has no blocks and no error. HashBody scans the body once
// without decoding it into maps (Prompt.Read), does not retain body, and
// is safe for concurrent use.
func (h *Hasher) HashBody(dst []uint64, model, adapter string, body []byte) (blocks []uint64, promptBytes int, err error) {
	pr, _ := h.prompts.Get().(*Prompt)
	if pr == nil {
		pr = h.NewPrompt()
	}
	defer h.putPrompt(pr)
	if _, err := pr.Read(body, nil); err != nil {
		return dst, 0, err
	}
	return pr.Hash(dst, model, adapter), pr.bytes, nil
}

func (h *Hasher) putPrompt(pr *Prompt) {
	if cap(pr.text) > maxPooledText {
		return
	}
	pr.Reset()
	h.prompts.Put(pr)
}

// renderBody renders body's prompt as HashBody sees it, appended to out; for
// tests and debugging.
func (h *Hasher) renderBody(out []byte, body []byte) ([]byte, int, error) {
	pr := h.NewPrompt()
	_, err := pr.Read(body, nil)
	if pr.tokens {
		return out, pr.bytes, err
	}
	pr.pieces(func(p []byte) { out = append(out, p...) })
	return out, pr.bytes, err
}

// Prompt is the prompt of one request body as HashBody renders it, read by
// Read and hashed by Hash. The rendered text does not depend on the model,
// the adapter or the salt, so a router can read a body once, before it knows
// the route (which names the model and adapter), and hash the prompt after.
//
// A Prompt belongs to the Hasher that made it (NewPrompt) and keeps its
// scratch space from one Read to the next. It is not safe for concurrent
// use. The zero value is not usable.
type Prompt struct {
	h      *Hasher
	text   []byte // rendered text of the (first) prompt, in the order of segs
	segs   []span // pieces of text in rendered order, then text[tail:]
	tail   int
	carry  []byte // a block straddling pieces, while hashing
	ids    []int  // token ids of the first prompt, when tokens; capped
	tokens bool   // the prompt is token ids
	bytes  int    // rendered bytes of every prompt of a batch
	read   bool   // a Read succeeded since the last Reset
	s      scan
}

// NewPrompt returns an empty Prompt for h.
func (h *Hasher) NewPrompt() *Prompt { return &Prompt{h: h} }

// Hasher returns the Hasher that made the Prompt.
func (pr *Prompt) Hasher() *Hasher { return pr.h }

// clear empties the rendered text.
func (pr *Prompt) clear() {
	pr.text, pr.segs, pr.tail = pr.text[:0], pr.segs[:0], 0
}

// reorder moves text[c0:h0], rendered before text[h0:], after it: the
// buffer stays as it is and segs records the order, so that nothing is
// copied. Truncating text later must not cut below the new tail.
func (pr *Prompt) reorder(c0, h0 int) {
	h1 := len(pr.text)
	if pr.tail < c0 {
		pr.segs = append(pr.segs, span{pr.tail, c0})
	}
	pr.segs = append(pr.segs, span{h0, h1}, span{c0, h0})
	pr.tail = h1
}

// pieces calls f with the rendered text in order.
func (pr *Prompt) pieces(f func([]byte)) {
	for _, sp := range pr.segs {
		f(pr.text[sp.start:sp.end])
	}
	f(pr.text[pr.tail:])
}

// Reset empties the Prompt, keeping its buffers.
func (pr *Prompt) Reset() {
	pr.clear()
	pr.ids = pr.ids[:0]
	pr.tokens, pr.bytes, pr.read = false, 0, false
	pr.s = scan{}
}

// Ok reports whether the Prompt holds the result of a successful Read (as
// opposed to a new, Reset or failed one).
func (pr *Prompt) Ok() bool { return pr.read }

// Bytes returns the rendered prompt length of the last Read, as HashBody
// returns it: bytes of rendered text, BytesPerToken per token id, every
// prompt of a batch counted.
func (pr *Prompt) Bytes() int { return pr.bytes }

// Hash appends to dst the chained block hashes of the prompt under model
// and adapter and returns the extended slice: exactly what HashBody would
// append for the body last read. An empty Prompt appends nothing. Hash
// leaves the prompt unchanged, so it may be called again, under another
// model, but it uses the Prompt's scratch space.
func (pr *Prompt) Hash(dst []uint64, model, adapter string) []uint64 {
	if pr.tokens {
		return pr.h.HashTokens(dst, model, adapter, pr.ids)
	}
	if len(pr.segs) == 0 {
		return pr.h.HashText(dst, model, adapter, pr.text)
	}
	return pr.h.hashPieces(dst, model, adapter, pr)
}

// Read renders the prompt of body (see HashBody for the fields read),
// replacing what the Prompt held. It reads the body in one pass: the
// object's keys and values are validated on the way (strings that become
// prompt text are unescaped as they are found), and the text is kept,
// unhashed, for Hash.
//
// When field is not nil it is called, in body order, with every top-level
// key (escapes decoded) and the span [start, end) of its value in body,
// after the value has been read; field must not retain key.
// An error from field stops Read, which returns it unchanged.
//
// Read returns the offset just after the object's closing brace (what
// follows is not read), or an error wrapping ErrBadBody, with the byte
// offset, when body is not a JSON object or is malformed up to that point;
// the Prompt is then empty. It does not retain body.
func (pr *Prompt) Read(body []byte, field func(key []byte, start, end int) error) (end int, err error) {
	pr.Reset()
	if cap(pr.text) < len(body)+16 {
		pr.text = make([]byte, 0, len(body)+len(body)/8+64)
	}
	end, err = pr.render(body, field)
	pr.s = scan{}
	if err != nil {
		pr.Reset()
		return end, err
	}
	pr.read = true
	return end, nil
}

// Fields calls field with every top-level key of the JSON object body
// (escapes decoded: "mod\u0065l" is model) and the span [start, end) of
// its value, in body order, reading the object with the scanner of Read
// but rendering nothing: for a router that reads other fields of a body
// whose prompt it does not hash, or fields of a response. Values are
// checked for structure (strings terminated, brackets balanced, literals
// and numbers spelled), not decoded; nesting is limited to 256 levels.
// field must not retain key. An error from field stops Fields, which
// returns it unchanged.
//
// Fields returns the offset just after the object's closing brace, or an
// error wrapping ErrBadBody, with the byte offset, when body (after blanks)
// is not a JSON object or is malformed up to that point. It does not retain
// body and is safe for concurrent use.
func Fields(body []byte, field func(key []byte, start, end int) error) (end int, err error) {
	s := scan{b: body}
	s.ws()
	if !s.eat('{') {
		return s.i, s.fail()
	}
	s.ws()
	if s.eat('}') {
		return s.i, nil
	}
	for {
		key, ok := s.member()
		if !ok {
			return s.i, s.fail()
		}
		v0 := s.i
		if !s.skip(0) {
			return s.i, s.fail()
		}
		if err := field(key, v0, s.i); err != nil {
			return s.i, err
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat('}') {
			return s.i, nil
		}
		return s.i, s.fail()
	}
}

// span is a byte range [start, end) of the body.
type span struct{ start, end int }

func (sp span) ok() bool { return sp.end > sp.start }

// render scans the body, rendering the messages (and a string prompt or
// input) as they are found, then settles the fixed order of the recognised
// fields.
func (pr *Prompt) render(body []byte, field func(key []byte, start, end int) error) (int, error) {
	s := &pr.s
	*s = scan{b: body}
	var tools, instr, msgs, prompt, input span
	early, late := false, false // messages rendered during the scan; tools or instructions after them
	var direct span             // a string prompt or input rendered during the scan
	s.ws()
	if !s.eat('{') {
		return s.i, s.fail()
	}
	s.ws()
	if !s.eat('}') {
		for {
			key, ok := s.member()
			if !ok {
				return s.i, s.fail()
			}
			v0 := s.i
			switch {
			case string(key) == "messages" && !msgs.ok() && v0 < len(body) && body[v0] == '[':
				// Render the messages during this scan (after any tools or
				// instructions seen so far); a tools or instructions field
				// after them means rendering again in the fixed order.
				pr.clear()
				direct = span{}
				if err := pr.chat(tools, instr, span{}); err != nil {
					return s.i, err
				}
				if err := pr.messages(v0); err != nil {
					return s.i, err
				}
				early = true
			case !early && (string(key) == "prompt" || string(key) == "input") && v0 < len(body) && body[v0] == '"':
				// A string prompt is rendered as it is read; the end of the
				// scan decides whether it stands.
				pr.clear()
				if !pr.stringAt(v0) {
					return s.i, s.fail()
				}
				direct = span{v0, s.i}
			default:
				if !s.skip(0) {
					return s.i, s.fail()
				}
			}
			v := span{v0, s.i}
			switch string(key) {
			case "messages":
				// A repeated key: the last one stands (as encoding/json
				// and the servers' Python readers take it), so messages
				// rendered during the scan are rendered again at its end.
				late = late || (early && msgs.ok())
				msgs = v
			case "prompt":
				prompt = v
			case "input":
				input = v
			case "instructions":
				// After the messages were rendered, a value that renders
				// something, or one that replaces a value that did (the
				// last of a repeated key stands, even a null), means
				// rendering again.
				late = late || (early && (rendersInstr(body, v) || rendersInstr(body, instr)))
				instr = v
			case "tools":
				late = late || (early && (rendersTools(body, v) || rendersTools(body, tools)))
				tools = v
			}
			if field != nil {
				if err := field(key, v.start, v.end); err != nil {
					return s.i, err
				}
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			if s.eat('}') {
				break
			}
			return s.i, s.fail()
		}
	}
	end := s.i
	var err error
	switch {
	case early && !late:
	case early:
		pr.clear()
		err = pr.chat(tools, instr, msgs)
	case msgs.ok():
		pr.clear()
		err = pr.chat(tools, instr, msgs)
	case prompt.ok():
		if prompt != direct {
			err = pr.promptValue(prompt, span{}, span{})
		}
	case input.ok():
		if input != direct || tools.ok() || instr.ok() {
			err = pr.promptValue(input, tools, instr)
		}
	default:
		pr.clear()
	}
	if err != nil {
		return s.i, err
	}
	if !pr.tokens {
		pr.bytes += len(pr.text)
	}
	return end, nil
}

// rendersTools reports whether chat renders the tools value at v: any
// value but null.
func rendersTools(b []byte, v span) bool { return v.ok() && !isNull(b[v.start:v.end]) }

// rendersInstr reports whether chat renders the instructions value at v: a
// string.
func rendersInstr(b []byte, v span) bool { return v.ok() && b[v.start] == '"' }

// chat renders tools, instructions and a messages array.
func (pr *Prompt) chat(tools, instr, msgs span) error {
	b := pr.s.b
	if rendersTools(b, tools) {
		pr.text = append(pr.text, sepMessage, 't', 'o', 'o', 'l', 's', sepField)
		pr.text = append(pr.text, b[tools.start:tools.end]...)
	}
	if rendersInstr(b, instr) {
		pr.text = append(pr.text, sepMessage, 's', 'y', 's', 't', 'e', 'm', sepField)
		if !pr.stringAt(instr.start) {
			return pr.s.fail()
		}
	}
	if msgs.ok() {
		return pr.messages(msgs.start)
	}
	return nil
}

// promptValue renders a completions prompt or a responses/embeddings input
// from its span, after clearing the text.
func (pr *Prompt) promptValue(v, tools, instr span) error {
	pr.clear()
	b := pr.s.b
	switch b[v.start] {
	case '"':
		if tools.ok() || instr.ok() {
			if err := pr.chat(tools, instr, span{}); err != nil {
				return err
			}
		}
		if !pr.stringAt(v.start) {
			return pr.s.fail()
		}
		return nil
	case '[':
	default:
		if isNull(b[v.start:v.end]) {
			return nil
		}
		return failAt(v.start)
	}
	// An array: look at its first element to tell strings, ids, id arrays
	// and message items apart.
	s := &pr.s
	s.i = v.start + 1
	s.ws()
	if s.i >= v.end || s.b[s.i] == ']' {
		return nil
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return pr.chat(tools, instr, v)
	case c == '"':
		return pr.stringBatch(v)
	case c == '[':
		return pr.tokenBatch(v)
	default:
		pr.tokens = true
		n, err := pr.tokenArray(v, true)
		pr.bytes = n * BytesPerToken
		return err
	}
}

// stringBatch keeps the first string of an array of strings as the text and
// counts the bytes of the others.
func (pr *Prompt) stringBatch(v span) error {
	s := &pr.s
	s.i = v.start + 1
	first := true
	for {
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return s.fail()
		}
		mark := len(pr.text)
		if !pr.stringAt(s.i) {
			return s.fail()
		}
		if !first {
			// Later prompts are counted, not hashed.
			pr.bytes += len(pr.text) - mark
			pr.text = pr.text[:mark]
		}
		first = false
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat(']') {
			return nil
		}
		return s.fail()
	}
}

// tokenBatch keeps the first token-id array of an array of arrays and
// counts the ids of all of them.
func (pr *Prompt) tokenBatch(v span) error {
	s := &pr.s
	s.i = v.start + 1
	total := 0
	pr.tokens = true
	for first := true; ; first = false {
		s.ws()
		start := s.i
		if !s.skip(1) {
			return s.fail()
		}
		if s.b[start] != '[' {
			return failAt(start)
		}
		end := s.i
		n, err := pr.tokenArray(span{start, end}, first)
		if err != nil {
			return err
		}
		total += n
		s.i = end
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat(']') {
			pr.bytes = total * BytesPerToken
			return nil
		}
		return s.fail()
	}
}

// tokenArray reads an array of integers, keeping them (up to what the
// Hasher can hash) when keep is set, and returns their number.
func (pr *Prompt) tokenArray(v span, keep bool) (int, error) {
	b := pr.s.b
	limit := pr.h.cfg.MaxBlocks * pr.h.cfg.TokenBlock
	i := v.start + 1
	n := 0
	for {
		for i < v.end && isSpace(b[i]) {
			i++
		}
		if i < v.end && b[i] == ']' && n == 0 {
			return 0, nil
		}
		x, j, ok := parseInt(b, i)
		if !ok {
			return 0, failAt(i)
		}
		if keep && len(pr.ids) < limit {
			pr.ids = append(pr.ids, x)
		}
		n++
		i = j
		for i < v.end && isSpace(b[i]) {
			i++
		}
		if i < v.end && b[i] == ',' {
			i++
			continue
		}
		if i < v.end && b[i] == ']' {
			return n, nil
		}
		return 0, failAt(i)
	}
}

// messages renders the array of chat messages or responses input items at
// offset i and leaves the scanner after it.
func (pr *Prompt) messages(i int) error {
	s := &pr.s
	s.i = i
	if !s.eat('[') {
		return s.fail()
	}
	s.ws()
	if s.eat(']') {
		return nil
	}
	for {
		s.ws()
		if err := pr.message(); err != nil {
			return err
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat(']') {
			return nil
		}
		return s.fail()
	}
}

// str is a string value found by the scanner: its raw content.
type str struct {
	start, end int
	ok         bool
}

// value reads the value at s.i: a string is returned as a str, any other
// value as a span (with an empty str).
func (pr *Prompt) value(depth int) (str, span, bool) {
	s := &pr.s
	v0 := s.i
	if v0 < len(s.b) && s.b[v0] == '"' {
		a, e, ok := s.str()
		return str{a, e, ok}, span{v0, s.i}, ok
	}
	ok := s.skip(depth)
	return str{}, span{v0, s.i}, ok
}

// message renders the message object at s.i and leaves the scanner after
// it: role, name, content, tool calls and tool_call_id in that order; an
// item with neither role nor content (a responses function_call, say)
// renders as its raw JSON.
//
// A string or array content is rendered while the object is scanned, so a
// long content is read once: after the head (role and name) when the role
// came first, as most clients write it, or else before the head, which is
// rendered at the end of the object and put back in front by reorder (Go
// clients that marshal a map write "content" before "role"). A key
// repeated after the content was rendered, or a name after a head already
// rendered, means rendering the message again from the spans of the scan.
func (pr *Prompt) message() error {
	s := &pr.s
	b := s.b
	start := s.i
	mark := len(pr.text)
	if !s.eat('{') {
		return s.fail()
	}
	var role, name, callID str
	var content str
	var contentSpan, calls span
	direct, redo, headFirst := false, false, false
	c0 := 0 // where a content rendered before its head starts
	s.ws()
	if !s.eat('}') {
		for {
			key, ok := s.member()
			if !ok {
				return s.fail()
			}
			if string(key) == "content" && !direct && s.i < len(b) && (b[s.i] == '"' || b[s.i] == '[') {
				v0 := s.i
				if role.ok {
					if !pr.head(role, name) {
						return failAt(v0)
					}
					headFirst = true
				}
				c0 = len(pr.text)
				if b[v0] == '"' {
					if !pr.stringAt(v0) {
						return s.fail()
					}
					content = str{start: v0 + 1, end: s.i - 1, ok: true}
				} else if err := pr.parts(v0); err != nil {
					return err
				}
				contentSpan = span{v0, s.i}
				direct = true
			} else {
				sv, v, ok := pr.value(2) // a message is at depth 1, as skip counts
				if !ok {
					return s.fail()
				}
				switch string(key) {
				case "role":
					role = sv
					redo = redo || headFirst
				case "name":
					name = sv
					redo = redo || headFirst
				case "content":
					content, contentSpan = sv, v
					redo = redo || direct
				case "tool_calls":
					calls = v
				case "tool_call_id":
					callID = sv
				}
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			if s.eat('}') {
				break
			}
			return s.fail()
		}
	}
	end := s.i
	defer func() { s.i = end }()
	if !direct || redo {
		pr.text = pr.text[:mark]
		if !role.ok && !contentSpan.ok() {
			pr.text = append(pr.text, sepMessage, sepPart)
			pr.text = append(pr.text, b[start:end]...)
			return nil
		}
		if !pr.head(role, name) {
			return failAt(start)
		}
		switch {
		case content.ok:
			if !pr.writeStr(content) {
				return failAt(content.start)
			}
		case contentSpan.ok() && b[contentSpan.start] == '[':
			if err := pr.parts(contentSpan.start); err != nil {
				return err
			}
		}
	} else if !headFirst {
		h0 := len(pr.text)
		if !pr.head(role, name) {
			return failAt(start)
		}
		pr.reorder(c0, h0)
	}
	if calls.ok() && !isNull(b[calls.start:calls.end]) {
		pr.text = append(pr.text, sepPart)
		pr.text = append(pr.text, b[calls.start:calls.end]...)
	}
	if callID.ok {
		pr.text = append(pr.text, sepPart)
		if !pr.writeStr(callID) {
			return failAt(callID.start)
		}
	}
	return nil
}

// head renders the start of a message, its role and name; it reports false
// for a bad escape in either.
func (pr *Prompt) head(role, name str) bool {
	pr.text = append(pr.text, sepMessage)
	if !pr.writeStr(role) {
		return false
	}
	pr.text = append(pr.text, sepField)
	if name.ok {
		if !pr.writeStr(name) {
			return false
		}
		pr.text = append(pr.text, sepField)
	}
	return true
}

// writeStr appends a scanned string value, unescaped; a missing one appends
// nothing. It reports false for a bad escape.
func (pr *Prompt) writeStr(v str) bool {
	if !v.ok {
		return true
	}
	var ok bool
	pr.text, _, ok = appendString(pr.text, pr.s.b, v.start-1)
	return ok
}

// parts renders the content array at offset i, text parts as their text,
// other parts as their raw JSON, and leaves the scanner after it.
func (pr *Prompt) parts(i int) error {
	s := &pr.s
	b := s.b
	s.i = i + 1
	s.ws()
	if s.eat(']') {
		return nil
	}
	for {
		s.ws()
		start := s.i
		switch {
		case start < len(b) && b[start] == '"':
			if !pr.stringAt(start) {
				return s.fail()
			}
		case start < len(b) && b[start] == '{':
			if err := pr.part(); err != nil {
				return err
			}
		default:
			if !s.skip(3) {
				return s.fail()
			}
			return failAt(start)
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat(']') {
			return nil
		}
		return s.fail()
	}
}

// part renders the content part object at s.i and leaves the scanner after
// it.
func (pr *Prompt) part() error {
	s := &pr.s
	b := s.b
	start := s.i
	var text str
	isText := false
	s.i++
	s.ws()
	if !s.eat('}') {
		for {
			key, ok := s.member()
			if !ok {
				return s.fail()
			}
			sv, v, ok := pr.value(4) // a part is at depth 3, as skip counts
			if !ok {
				return s.fail()
			}
			switch string(key) {
			case "text":
				text = sv
			case "type":
				switch string(b[v.start:v.end]) {
				case `"text"`, `"input_text"`, `"output_text"`:
					isText = true
				}
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			if s.eat('}') {
				break
			}
			return s.fail()
		}
	}
	if isText && text.ok {
		if !pr.writeStr(text) {
			return failAt(text.start)
		}
		return nil
	}
	pr.text = append(pr.text, sepPart)
	pr.text = append(pr.text, b[start:s.i]...)
	return nil
}

// stringAt appends the unescaped JSON string whose opening quote is at i and
// leaves the scanner after it. It reports false for a malformed string.
func (pr *Prompt) stringAt(i int) bool {
	var ok bool
	var next int
	pr.text, next, ok = appendString(pr.text, pr.s.b, i)
	if !ok {
		pr.s.i = i
		return false
	}
	pr.s.i = next
	return true
}

// appendStringGeneric appends to dst the decoded content of the JSON
// string whose opening quote is at b[i], and returns dst, the offset after
// the closing quote and true; or false (and dst as given) for an
// unterminated string or a bad escape. It reads the string once: the next
// quote and the next backslash are found with bytes.IndexByte (vectorised
// in the standard library) and remembered until passed, and the runs
// between escapes are copied whole, so a string without escapes costs two
// searches and one copy. Escapes decode as encoding/json decodes them
// (unescapeU); raw control characters pass. appendString, which the
// parser calls, is this function where no assembly scan exists
// (scan_other.go) and the same contract with a one-pass scan and copy on
// amd64 (scan_amd64.go); tests check that the two agree.
func appendStringGeneric(dst, b []byte, i int) ([]byte, int, bool) {
	// The decoded string is never longer than its raw form, so room for
	// the rest of b keeps every write in place.
	dst = slices.Grow(dst, len(b)-i)
	n := len(dst)
	out := dst[:cap(dst)]
	j := i + 1
	// The next quote at or after j, and the next backslash at or after j
	// and before that quote (the quote itself if none); stale when < j.
	nq, nb := -1, -1
	for {
		if nq < j {
			if nq = indexFrom(b, j, '"'); nq == len(b) {
				return dst, i, false
			}
		}
		if nb < j {
			nb = indexFrom(b[:nq], j, '\\')
		}
		if nb == nq { // no backslash before the quote: it ends the string
			n += copy(out[n:], b[j:nq])
			return out[:n], nq + 1, true
		}
		n += copy(out[n:], b[j:nb])
		j = nb
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

// indexFrom returns the index of the first c in b at or after j, or len(b).
func indexFrom(b []byte, j int, c byte) int {
	if k := bytes.IndexByte(b[j:], c); k >= 0 {
		return j + k
	}
	return len(b)
}

// unescaped maps the character after a backslash to the byte its two-byte
// escape stands for (RFC 8259, section 7), and every other byte to 0.
var unescaped = [256]byte{
	'"': '"', '\\': '\\', '/': '/',
	'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t',
}

// unescapeU decodes the \u escape at b[j] (a backslash) into out[n:] and
// returns the new n and j; false when it is not a well-formed \u escape.
// A surrogate pair decodes to one rune; a lone surrogate (or one followed by
// a \u escape that does not complete it, which is then read on its own) is
// U+FFFD, as in encoding/json.
func unescapeU(out []byte, n int, b []byte, j int) (int, int, bool) {
	if j+1 >= len(b) || b[j+1] != 'u' {
		return n, j, false
	}
	r, ok := hex4(b[j+2:])
	if !ok {
		return n, j, false
	}
	j += 6
	if utf16.IsSurrogate(r) {
		d := utf8.RuneError
		if j+6 <= len(b) && b[j] == '\\' && b[j+1] == 'u' {
			if r2, ok := hex4(b[j+2:]); ok {
				d = utf16.DecodeRune(r, r2)
			}
		}
		if r = d; d != utf8.RuneError {
			j += 6
		}
	}
	return n + utf8.EncodeRune(out[n:], r), j, true
}

func hex4(p []byte) (rune, bool) {
	if len(p) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

func failAt(i int) error {
	return &SyntaxError{Offset: i}
}

// scan is a minimal JSON scanner over a byte slice: it finds value
// boundaries and string contents without building any values.
type scan struct {
	b []byte
	i int
}

func (s *scan) fail() error { return failAt(s.i) }

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func (s *scan) ws() {
	for s.i < len(s.b) && isSpace(s.b[s.i]) {
		s.i++
	}
}

func (s *scan) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// member reads an object member's key and the colon after it, with the
// blanks around them, leaving s at the value. It returns the key's
// contents, with its escapes decoded when it has any (into a new slice:
// such keys are rare, and a key must outlive the members nested in its
// value), so that "mod\u0065l" is the key model, as every JSON reader
// behind a router reads it; or ok false with s where the member is
// malformed (a bad escape in the key included).
func (s *scan) member() (key []byte, ok bool) {
	s.ws()
	at := s.i
	start, end, ok := s.str()
	if !ok {
		return nil, false
	}
	key = s.b[start:end]
	if bytes.IndexByte(key, '\\') >= 0 {
		// appendString ends at the quote str found: both stop at the first
		// quote not escaped by an odd run of backslashes. It is given the
		// key alone (through its closing quote), because it sizes its
		// output by what is left of its input: given the whole body, each
		// escaped key would allocate the rest of the body, and a body of
		// many such keys would cost time and memory quadratic in its size.
		if key, _, ok = appendString(nil, s.b[:end+1], at); !ok {
			s.i = at
			return nil, false
		}
	}
	s.ws()
	if !s.eat(':') {
		return nil, false
	}
	s.ws()
	return key, true
}

// str reads the string at s.i (which must be a quote) and returns the
// bounds of its raw content. It jumps from quote to quote with
// bytes.IndexByte; a quote ends the string unless an odd number of
// backslashes precedes it.
func (s *scan) str() (start, end int, ok bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return 0, 0, false
	}
	start = s.i + 1
	for i := start; ; {
		k := bytes.IndexByte(s.b[i:], '"')
		if k < 0 {
			return 0, 0, false
		}
		q := i + k
		p := q - 1
		for p >= start && s.b[p] == '\\' {
			p--
		}
		if (q-1-p)%2 == 0 {
			s.i = q + 1
			return start, q, true
		}
		i = q + 1
	}
}

// skip advances past the value at s.i, checking its structure.
func (s *scan) skip(depth int) bool {
	if depth > maxDepth || s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; c {
	case '"':
		_, _, ok := s.str()
		return ok
	case '{', '[':
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		s.i++
		s.ws()
		if s.eat(closer) {
			return true
		}
		for {
			s.ws()
			if c == '{' {
				if _, _, ok := s.str(); !ok {
					return false
				}
				s.ws()
				if !s.eat(':') {
					return false
				}
				s.ws()
			}
			if !s.skip(depth + 1) {
				return false
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			return s.eat(closer)
		}
	case 't':
		return s.lit("true")
	case 'f':
		return s.lit("false")
	case 'n':
		return s.lit("null")
	default:
		// A number starts with a minus or a digit; the rest of its
		// characters are taken, not checked in order.
		if c != '-' && (c < '0' || c > '9') {
			return false
		}
		j := s.i + 1
		for j < len(s.b) {
			switch s.b[j] {
			case '-', '+', '.', 'e', 'E', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
				j++
				continue
			}
			break
		}
		s.i = j
		return true
	}
}

func (s *scan) lit(word string) bool {
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		return false
	}
	s.i += len(word)
	return true
}

func isNull(v []byte) bool { return string(v) == "null" }

// parseInt reads a JSON integer at b[i:] and returns it and the offset after
// it.
func parseInt(b []byte, i int) (int, int, bool) {
	neg := false
	if i < len(b) && b[i] == '-' {
		neg = true
		i++
	}
	start := i
	x := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		if i-start > 18 {
			return 0, i, false
		}
		x = x*10 + int(b[i]-'0')
		i++
	}
	if i == start {
		return 0, i, false
	}
	if neg {
		x = -x
	}
	return x, i, true
}
