package prefix

// This file keeps the first version of HashBody's renderer (a streaming
// block sink fed by a two-pass string scanner), unchanged but for its
// names and one fix (a repeated "tools" or "instructions" whose last value
// is null after the messages: the last value stands), as the reference the
// current renderer is tested against: the rendered text, and so every
// block hash, must stay byte-identical.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// legacyHashBody is the first version of HashBody.
func (h *Hasher) legacyHashBody(dst []uint64, model, adapter string, body []byte) ([]uint64, int, error) {
	st := h.legacyGetState(dst, model, adapter)
	defer h.legacyPutState(st)
	n, err := st.render(body)
	if err != nil {
		return dst, 0, err
	}
	return st.text.dst, n, nil
}

// legacyRenderBody is the first version of renderBody.
func (h *Hasher) legacyRenderBody(out []byte, body []byte) ([]byte, int, error) {
	st := h.legacyGetState(nil, "", "")
	defer h.legacyPutState(st)
	st.text.keep = true
	st.text.kept = out
	st.text.kept0 = len(out)
	n, err := st.render(body)
	return st.text.kept, n, err
}

// legacyBodyState is the per-call state of HashBody, pooled.
type legacyBodyState struct {
	h    *Hasher
	text legacyTextSink
	tok  legacyTokenSink
	s    legacyScan
}

func (h *Hasher) legacyGetState(dst []uint64, model, adapter string) *legacyBodyState {
	st := &legacyBodyState{h: h} // not pooled: the reference need not be fast
	st.text.buf = make([]byte, h.cfg.BlockBytes)
	st.tok.buf = make([]int, h.cfg.TokenBlock)
	st.text.reset(h, dst, h.seed(domainText, model, adapter))
	st.tok.reset(h, dst, h.seed(domainTokens, model, adapter))
	return st
}

func (h *Hasher) legacyPutState(st *legacyBodyState) {
	st.text.dst = nil
	st.text.kept = nil
	st.text.keep = false
	st.tok.dst = nil
	st.s = legacyScan{}
}

// legacySpan is a byte range [start, end) of the body.
type legacySpan struct{ start, end int }

func (sp legacySpan) ok() bool { return sp.end > sp.start }

// render scans the body, then renders the recognised fields in a fixed
// order and returns the prompt length.
func (st *legacyBodyState) render(body []byte) (int, error) {
	s := &st.s
	*s = legacyScan{b: body}
	var tools, instr, msgs, prompt, input legacySpan
	early, late := false, false // messages rendered during the legacyScan; tools or instructions after them
	s.ws()
	if !s.eat('{') {
		return 0, s.fail()
	}
	s.ws()
	if !s.eat('}') {
		for {
			s.ws()
			ks, ke, _, ok := s.legacyStr()
			if !ok {
				return 0, s.fail()
			}
			s.ws()
			if !s.eat(':') {
				return 0, s.fail()
			}
			s.ws()
			v0 := s.i
			key := string(body[ks:ke])
			if key == "messages" && !msgs.ok() && v0 < len(body) && body[v0] == '[' {
				// Render the messages during this legacyScan (after any tools or
				// instructions seen so far); a tools or instructions field
				// after them means rendering again in the fixed order.
				if _, err := st.chat(tools, instr, legacySpan{}); err != nil {
					return 0, err
				}
				if err := st.messages(legacySpan{v0, len(body)}); err != nil {
					return 0, err
				}
				msgs = legacySpan{v0, s.i}
				early = true
			} else if !s.skip(0) {
				return 0, s.fail()
			}
			v := legacySpan{v0, s.i}
			switch key {
			case "messages":
				// A repeated key: the last one stands, as encoding/json takes it.
				late = late || (early && msgs.ok() && msgs != v)
				msgs = v
			case "prompt":
				prompt = v
			case "input":
				input = v
			case "instructions":
				// The last of a repeated key stands, a null too: render
				// again if the value rendered with the messages was not
				// null. (The first version missed that case.)
				late = late || (early && (!legacyIsNull(body[v.start:v.end]) || instr.ok() && !legacyIsNull(body[instr.start:instr.end])))
				instr = v
			case "tools":
				late = late || (early && (!legacyIsNull(body[v.start:v.end]) || tools.ok() && !legacyIsNull(body[tools.start:tools.end])))
				tools = v
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			if s.eat('}') {
				break
			}
			return 0, s.fail()
		}
	}
	switch {
	case early && !late:
		return st.text.total, nil
	case early:
		st.text.restart()
		return st.chat(tools, instr, msgs)
	case msgs.ok():
		return st.chat(tools, instr, msgs)
	case prompt.ok():
		return st.promptValue(prompt, legacySpan{}, legacySpan{})
	case input.ok():
		return st.promptValue(input, tools, instr)
	}
	return 0, nil
}

// chat renders tools, instructions and a messages array.
func (st *legacyBodyState) chat(tools, instr, msgs legacySpan) (int, error) {
	b := st.s.b
	w := &st.text
	if tools.ok() && !legacyIsNull(b[tools.start:tools.end]) {
		w.writeByte(sepMessage)
		w.writeString("tools")
		w.writeByte(sepField)
		w.write(b[tools.start:tools.end])
	}
	if instr.ok() && b[instr.start] == '"' {
		w.writeByte(sepMessage)
		w.writeString("system")
		w.writeByte(sepField)
		if err := st.stringAt(instr.start); err != nil {
			return 0, err
		}
	}
	if msgs.ok() {
		if err := st.messages(msgs); err != nil {
			return 0, err
		}
	}
	return w.total, nil
}

// promptValue renders a completions prompt or a responses/embeddings input.
func (st *legacyBodyState) promptValue(v, tools, instr legacySpan) (int, error) {
	b := st.s.b
	switch b[v.start] {
	case '"':
		if tools.ok() || instr.ok() {
			if _, err := st.chat(tools, instr, legacySpan{}); err != nil {
				return 0, err
			}
		}
		if err := st.stringAt(v.start); err != nil {
			return 0, err
		}
		return st.text.total, nil
	case '[':
	default:
		if legacyIsNull(b[v.start:v.end]) {
			return 0, nil
		}
		return 0, st.failAt(v.start)
	}
	// An array: look at its first element to tell strings, ids, id arrays
	// and message items apart.
	s := &st.s
	s.i = v.start + 1
	s.ws()
	if s.i >= v.end || s.b[s.i] == ']' {
		return 0, nil
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return st.chat(tools, instr, v)
	case c == '"':
		return st.stringBatch(v)
	case c == '[':
		return st.tokenBatch(v)
	default:
		n, err := st.tokens(v)
		if err != nil {
			return 0, err
		}
		st.text.dst = st.tok.dst
		return n * BytesPerToken, nil
	}
}

// stringBatch hashes the first string of an array of strings and counts
// the bytes of all of them.
func (st *legacyBodyState) stringBatch(v legacySpan) (int, error) {
	s := &st.s
	s.i = v.start + 1
	first := true
	for {
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return 0, s.fail()
		}
		if err := st.stringAt(s.i); err != nil {
			return 0, err
		}
		if first {
			st.text.left = 0 // later prompts are counted, not hashed
			st.text.keep = false
			first = false
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat(']') {
			return st.text.total, nil
		}
		return 0, s.fail()
	}
}

// tokenBatch hashes the first token-id array of an array of arrays and
// counts the ids of all of them.
func (st *legacyBodyState) tokenBatch(v legacySpan) (int, error) {
	s := &st.s
	s.i = v.start + 1
	total := 0
	for {
		s.ws()
		start := s.i
		if !s.skip(0) {
			return 0, s.fail()
		}
		if s.b[start] != '[' {
			return 0, st.failAt(start)
		}
		end := s.i
		n, err := st.tokens(legacySpan{start, end})
		if err != nil {
			return 0, err
		}
		total += n
		st.tok.left = 0
		s.i = end
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat(']') {
			st.text.dst = st.tok.dst
			return total * BytesPerToken, nil
		}
		return 0, s.fail()
	}
}

// tokens feeds an array of integers to the token sink and returns their
// number.
func (st *legacyBodyState) tokens(v legacySpan) (int, error) {
	b := st.s.b
	i := v.start + 1
	n := 0
	for {
		for i < v.end && legacyIsSpace(b[i]) {
			i++
		}
		if i < v.end && b[i] == ']' && n == 0 {
			return 0, nil
		}
		x, j, ok := legacyParseInt(b, i)
		if !ok {
			return 0, st.failAt(i)
		}
		st.tok.add(x)
		n++
		i = j
		for i < v.end && legacyIsSpace(b[i]) {
			i++
		}
		if i < v.end && b[i] == ',' {
			i++
			continue
		}
		if i < v.end && b[i] == ']' {
			return n, nil
		}
		return 0, st.failAt(i)
	}
}

// messages renders an array of chat messages or responses input items.
func (st *legacyBodyState) messages(v legacySpan) error {
	s := &st.s
	s.i = v.start
	if !s.eat('[') {
		return s.fail()
	}
	s.ws()
	if s.eat(']') {
		return nil
	}
	for {
		s.ws()
		if err := st.message(); err != nil {
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

// legacyStr is a string value found by the scanner: its raw content and whether
// it has escapes.
type legacyStr struct {
	start, end int
	esc        bool
	ok         bool
}

// value reads the value at s.i: a string is returned as a legacyStr, any other
// value as a legacySpan (with an empty legacyStr).
func (st *legacyBodyState) value(depth int) (legacyStr, legacySpan, bool) {
	s := &st.s
	v0 := s.i
	if v0 < len(s.b) && s.b[v0] == '"' {
		a, e, esc, ok := s.legacyStr()
		return legacyStr{a, e, esc, ok}, legacySpan{v0, s.i}, ok
	}
	ok := s.skip(depth)
	return legacyStr{}, legacySpan{v0, s.i}, ok
}

// message renders the message object at s.i and leaves the scanner after
// it: role, name, content, tool calls and tool_call_id in that order; an
// item with neither role nor content (a responses function_call, say)
// renders as its raw JSON.
func (st *legacyBodyState) message() error {
	s := &st.s
	b := s.b
	w := &st.text
	start := s.i
	if !s.eat('{') {
		return s.fail()
	}
	var role, name, content, callID legacyStr
	var contentSpan, calls legacySpan
	s.ws()
	if !s.eat('}') {
		for {
			s.ws()
			ks, ke, _, ok := s.legacyStr()
			if !ok {
				return s.fail()
			}
			s.ws()
			if !s.eat(':') {
				return s.fail()
			}
			s.ws()
			sv, v, ok := st.value(1)
			if !ok {
				return s.fail()
			}
			switch string(b[ks:ke]) {
			case "role":
				role = sv
			case "name":
				name = sv
			case "content":
				content, contentSpan = sv, v
			case "tool_calls":
				calls = v
			case "tool_call_id":
				callID = sv
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
	if !role.ok && !contentSpan.ok() {
		w.writeByte(sepMessage)
		w.writeByte(sepPart)
		w.write(b[start:end])
		return nil
	}
	w.writeByte(sepMessage)
	if err := st.writeStr(role); err != nil {
		return err
	}
	w.writeByte(sepField)
	if name.ok {
		if err := st.writeStr(name); err != nil {
			return err
		}
		w.writeByte(sepField)
	}
	switch {
	case content.ok:
		if err := st.writeStr(content); err != nil {
			return err
		}
	case contentSpan.ok() && b[contentSpan.start] == '[':
		if err := st.parts(contentSpan); err != nil {
			return err
		}
	}
	if calls.ok() && !legacyIsNull(b[calls.start:calls.end]) {
		w.writeByte(sepPart)
		w.write(b[calls.start:calls.end])
	}
	if callID.ok {
		w.writeByte(sepPart)
		if err := st.writeStr(callID); err != nil {
			return err
		}
	}
	return nil
}

// writeStr writes a scanned string value, unescaped; a missing one writes
// nothing.
func (st *legacyBodyState) writeStr(v legacyStr) error {
	if !v.ok {
		return nil
	}
	if !v.esc {
		st.text.write(st.s.b[v.start:v.end])
		return nil
	}
	if !st.unescape(st.s.b[v.start:v.end]) {
		return st.failAt(v.start)
	}
	return nil
}

// parts renders a content array: text parts as their text, other parts as
// their raw JSON.
func (st *legacyBodyState) parts(v legacySpan) error {
	s := &st.s
	b := s.b
	s.i = v.start + 1
	s.ws()
	if s.eat(']') {
		return nil
	}
	for {
		s.ws()
		start := s.i
		if !s.skip(2) {
			return s.fail()
		}
		end := s.i
		switch b[start] {
		case '"':
			if err := st.stringAt(start); err != nil {
				return err
			}
		case '{':
			if err := st.part(legacySpan{start, end}); err != nil {
				return err
			}
		default:
			return st.failAt(start)
		}
		s.i = end
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

// part renders one content part.
func (st *legacyBodyState) part(p legacySpan) error {
	s := &st.s
	b := s.b
	var text legacyStr
	isText := false
	s.i = p.start + 1
	s.ws()
	if !s.eat('}') {
		for {
			s.ws()
			ks, ke, _, ok := s.legacyStr()
			if !ok {
				return s.fail()
			}
			s.ws()
			if !s.eat(':') {
				return s.fail()
			}
			s.ws()
			sv, v, ok := st.value(3)
			if !ok {
				return s.fail()
			}
			switch string(b[ks:ke]) {
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
		return st.writeStr(text)
	}
	st.text.writeByte(sepPart)
	st.text.write(b[p.start:p.end])
	return nil
}

// stringAt writes the unescaped JSON string starting at the quote at i and
// leaves the scanner after it.
func (st *legacyBodyState) stringAt(i int) error {
	s := &st.s
	s.i = i
	start, end, esc, ok := s.legacyStr()
	if !ok {
		return s.fail()
	}
	if !esc {
		st.text.write(s.b[start:end])
		return nil
	}
	if !st.unescape(s.b[start:end]) {
		return st.failAt(start)
	}
	return nil
}

// unescape writes the decoded form of the escaped JSON string content p.
func (st *legacyBodyState) unescape(p []byte) bool {
	w := &st.text
	for len(p) > 0 {
		k := bytes.IndexByte(p, '\\')
		if k < 0 {
			w.write(p)
			return true
		}
		w.write(p[:k])
		p = p[k:]
		if len(p) < 2 {
			return false
		}
		switch c := p[1]; c {
		case '"', '\\', '/':
			w.writeByte(c)
		case 'b':
			w.writeByte('\b')
		case 'f':
			w.writeByte('\f')
		case 'n':
			w.writeByte('\n')
		case 'r':
			w.writeByte('\r')
		case 't':
			w.writeByte('\t')
		case 'u':
			r, ok := legacyHex4(p[2:])
			if !ok {
				return false
			}
			p = p[6:]
			if utf16.IsSurrogate(r) {
				if len(p) >= 6 && p[0] == '\\' && p[1] == 'u' {
					if r2, ok := legacyHex4(p[2:]); ok {
						if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
							r = d
							p = p[6:]
						} else {
							r = utf8.RuneError
						}
					}
				} else {
					r = utf8.RuneError
				}
			}
			var enc [utf8.UTFMax]byte
			n := utf8.EncodeRune(enc[:], r)
			w.write(enc[:n])
			continue
		default:
			return false
		}
		p = p[2:]
	}
	return true
}

func legacyHex4(p []byte) (rune, bool) {
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

func (st *legacyBodyState) failAt(i int) error {
	return fmt.Errorf("%w at byte %d", ErrBadBody, i)
}

// legacyScan is a minimal JSON scanner over a byte slice: it finds value
// boundaries and string contents without building any values.
type legacyScan struct {
	b []byte
	i int
}

func (s *legacyScan) fail() error { return fmt.Errorf("%w at byte %d", ErrBadBody, s.i) }

func legacyIsSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func (s *legacyScan) ws() {
	for s.i < len(s.b) && legacyIsSpace(s.b[s.i]) {
		s.i++
	}
}

func (s *legacyScan) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// legacyStr reads the string at s.i (which must be a quote) and returns the
// bounds of its raw content and whether it contains escapes.
func (s *legacyScan) legacyStr() (start, end int, esc, ok bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return 0, 0, false, false
	}
	start = s.i + 1
	i := start
	for {
		j := legacyNextSpecial(s.b, i)
		if j < 0 {
			return 0, 0, false, false
		}
		if s.b[j] == '"' {
			s.i = j + 1
			return start, j, esc, true
		}
		esc = true
		i = j + 2 // skip the escaped character
	}
}

// SWAR constants: a byte of ones and a byte of high bits in every lane.
const (
	legacyLanesLo = 0x0101010101010101
	legacyLanesHi = 0x8080808080808080
)

// legacyNextSpecial returns the index of the first '"' or '\\' in b at or after
// i, or -1. It tests eight bytes per step with the "has zero byte" bit
// trick (Sean Eron Anderson, "Bit Twiddling Hacks", determining if a word
// has a byte equal to n): the lowest flagged byte is exact.
func legacyNextSpecial(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		q := w ^ (legacyLanesLo * '"')
		e := w ^ (legacyLanesLo * '\\')
		if t := ((q - legacyLanesLo) &^ q) | ((e - legacyLanesLo) &^ e); t&legacyLanesHi != 0 {
			return i + bits.TrailingZeros64(t&legacyLanesHi)/8
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' {
			return i
		}
	}
	return -1
}

// skip advances past the value at s.i, checking its structure.
func (s *legacyScan) skip(depth int) bool {
	if depth > maxDepth || s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; c {
	case '"':
		_, _, _, ok := s.legacyStr()
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
				if _, _, _, ok := s.legacyStr(); !ok {
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
		j := s.i
		for j < len(s.b) {
			switch s.b[j] {
			case '-', '+', '.', 'e', 'E', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
				j++
				continue
			}
			break
		}
		if j == s.i {
			return false
		}
		s.i = j
		return true
	}
}

func (s *legacyScan) lit(word string) bool {
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		return false
	}
	s.i += len(word)
	return true
}

func legacyIsNull(v []byte) bool { return string(v) == "null" }

// legacyParseInt reads a JSON integer at b[i:] and returns it and the offset after
// it.
func legacyParseInt(b []byte, i int) (int, int, bool) {
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

// legacyTextSink cuts rendered text into blocks and hashes them as they fill,
// hashing straight from the body when a whole block is available.
type legacyTextSink struct {
	h     *Hasher
	buf   []byte // BlockBytes long; buf[:n] is the pending partial block
	n     int
	prev  uint64
	dst   []uint64
	left  int // blocks still allowed
	total int // rendered bytes so far

	dst0 int    // len(dst) at reset
	seed uint64 // prev at reset

	keep  bool // tests: also collect the rendered bytes
	kept  []byte
	kept0 int // len(kept) when keeping started
}

func (w *legacyTextSink) reset(h *Hasher, dst []uint64, seed uint64) {
	w.h, w.n, w.prev, w.dst, w.left, w.total = h, 0, seed, dst, h.cfg.MaxBlocks, 0
	w.dst0, w.seed = len(dst), seed
	w.kept0 = -1
}

// restart forgets everything written since reset.
func (w *legacyTextSink) restart() {
	w.n, w.prev, w.dst, w.left, w.total = 0, w.seed, w.dst[:w.dst0], w.h.cfg.MaxBlocks, 0
	if w.keep {
		w.kept = w.kept[:w.kept0]
	}
}

func (w *legacyTextSink) emit(b []byte) {
	w.prev = hashBytes(w.prev, b)
	w.dst = append(w.dst, w.prev)
	w.left--
}

func (w *legacyTextSink) write(p []byte) {
	w.total += len(p)
	if w.keep {
		w.kept = append(w.kept, p...)
	}
	if w.left <= 0 {
		return
	}
	bs := len(w.buf)
	if w.n > 0 {
		k := copy(w.buf[w.n:], p)
		w.n += k
		p = p[k:]
		if w.n < bs {
			return
		}
		w.emit(w.buf)
		w.n = 0
	}
	for len(p) >= bs && w.left > 0 {
		w.emit(p[:bs])
		p = p[bs:]
	}
	if w.left > 0 {
		w.n = copy(w.buf, p)
	}
}

func (w *legacyTextSink) writeByte(c byte) {
	var one = [1]byte{c}
	w.write(one[:])
}

func (w *legacyTextSink) writeString(s string) {
	for i := 0; i < len(s); i++ {
		w.writeByte(s[i])
	}
}

// legacyTokenSink cuts token ids into blocks and hashes them as they fill.
type legacyTokenSink struct {
	h    *Hasher
	buf  []int
	n    int
	prev uint64
	dst  []uint64
	left int
}

func (w *legacyTokenSink) reset(h *Hasher, dst []uint64, seed uint64) {
	w.h, w.n, w.prev, w.dst, w.left = h, 0, seed, dst, h.cfg.MaxBlocks
}

func (w *legacyTokenSink) add(t int) {
	if w.left <= 0 {
		return
	}
	w.buf[w.n] = t
	w.n++
	if w.n == len(w.buf) {
		w.prev = hashTokens(w.prev, w.buf)
		w.dst = append(w.dst, w.prev)
		w.n = 0
		w.left--
	}
}
