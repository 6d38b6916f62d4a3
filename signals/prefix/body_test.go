package prefix

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// edgeBodies are bodies that exercise the corners of the renderer: key
// orders, repeated keys, escapes and surrogates, parts, tools, items, ids
// and batches, and malformed ones.
var edgeBodies = []string{
	`{}`,
	` { "model" : "m" } `,
	`{"messages":[]}`,
	`{"messages":null}`,
	`{"messages":[{"role":"user","content":"plain"}]}`,
	`{"mess\u0061ges":[{"r\u006fle":"user","c\u006Ftent":"escaped keys"}]}`,
	`{"messages":[{"content":"content first","role":"user","name":"n"}]}`,
	`{"messages":[{"role":"user","content":"name after","name":"bob"}]}`,
	`{"messages":[{"role":"user","content":"one","content":"two"}]}`,
	`{"messages":[{"role":"user","content":"x","role":"assistant"}]}`,
	`{"messages":[{"role":"u\"ser","name":"b\\ob","content":"esc \n \t \r \b \f \/ \\ \" \u00e9 \u4e16 \ud83d\ude00 end"}]}`,
	`{"messages":[{"role":"user","content":"lone \ud800 high, lone \udc00 low, \ud800\u0041 pair-less, \ud83d\ud83d twice"}]}`,
	`{"messages":[{"role":"user","content":"tail escape \u0041"}]}`,
	`{"messages":[{"role":"user","content":"\\"}]}`,
	`{"messages":[{"role":"user","content":"1234567\n1234567\"1234567\\"}]}`,
	`{"messages":[{"role":"user","content":null},{"role":"assistant","content":5}]}`,
	`{"messages":[{"role":"user","content":["a", "b", {"type":"text","text":"c\n"}]}]}`,
	`{"messages":[{"content":[{"text":"t","type":"input_text"},{"type":"image_url","image_url":{"url":"data:x"}}],"role":"user"}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text"},{"type":"text","text":5}]}]}`,
	`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c\u0031","content":"72F"}]}`,
	`{"messages":[{"type":"function_call","call_id":"x"},{"role":5}]}`,
	`{"messages":[{"role":"user","content":"m"}],"tools":[{"type":"function"}]}`,
	`{"tools":[{"type":"function"}],"messages":[{"role":"user","content":"m"}],"tools":null}`,
	`{"tools":[1],"messages":[{"role":"user","content":"m"}],"tools":[2],"tools":null}`,
	`{"messages":[{"role":"user","content":"m"}],"tools":[1],"tools":null}`,
	`{"instructions":"sys","messages":[{"role":"user","content":"m"}],"instructions":null}`,
	`{"instructions":"sys","messages":[{"role":"user","content":"m"}],"instructions":5}`,
	`{"instructions":5,"messages":[{"role":"user","content":"m"}],"instructions":null}`,
	`{"instructions":"be \"brief\"","messages":[{"role":"user","content":"m"}]}`,
	`{"messages":[{"role":"user","content":"m"}],"instructions":"late"}`,
	`{"messages":[{"role":"user","content":"first"}],"messages":[{"role":"user","content":"second"}]}`,
	`{"messages":[{"role":"user","content":"first"}],"messages":[{"role":"user","content":"second"}],"tools":[1]}`,
	`{"prompt":"a completion \u00e9\n"}`,
	`{"prompt":"first","prompt":"second"}`,
	`{"prompt":"p","input":"i"}`,
	`{"input":"i","prompt":"p"}`,
	`{"prompt":"p","messages":[{"role":"user","content":"m"}]}`,
	`{"prompt":["one","two\n","three"]}`,
	`{"prompt":[1,2,3,-4,5]}`,
	`{"prompt":[[1,2,3],[4,5]]}`,
	`{"prompt":[[],[4,5]]}`,
	`{"prompt":[]}`,
	`{"prompt":null}`,
	`{"prompt":[{"role":"user","content":"as items"}]}`,
	`{"input":"in","instructions":"sys"}`,
	`{"tools":[{"type":"function"}],"input":"in"}`,
	`{"input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","arguments":"{}"}],"instructions":"s"}`,
	`{"input":[7,8,9],"instructions":"ignored with ids"}`,
	`{"input":null,"tools":null}`,
	// Malformed.
	``,
	`[]`,
	`{`,
	`{"messages":[{"role":"user","content":"x"}`,
	`{"messages":"x"}`,
	`{"messages":[1]}`,
	`{"prompt":[1,2,"x"]}`,
	`{"prompt":[1.5]}`,
	`{"model":"m","temperature":.5,"prompt":"x"}`,
	`{"model":"m","n":+1,"prompt":"x"}`,
	`{"prompt":"unterminated}`,
	`{"prompt":"bad escape \q"}`,
	`{"prompt":"bad \u12"}`,
	`{"prompt":"bad \ud800\u12"}`,
	`{"messages":[{"role":"us\qer","content":"x"}]}`,
	`{"messages":[{"role":"user","name":"\x","content":"x"}]}`,
	`{"messages":[{"role":"user","content":"x\"}]}`,
	`{"model" "m"}`,
	`{"prompt":true}`,
	`{"prompt":[[1,2],"x"]}`,
	`{"prompt":["x",1]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]]}`,
	`{"messages":[{"role":"user","content":[1]}]}`,
	`{"a":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `}`,
}

// fixtureBodies returns every JSON request body of the shared fixtures.
func fixtureBodies(t testing.TB) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(fixtures, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".json") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out[path] = b
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, out)
	return out
}

// longBodies are large bodies whose escapes fall at every offset of the
// eight-byte words and straddle block boundaries.
func longBodies() []string {
	var out []string
	for _, every := range []int{1, 3, 7, 8, 9, 31, 64, 200} {
		var sb strings.Builder
		for i := 0; i < 3000; i++ {
			if i%every == every-1 {
				sb.WriteString([]string{`\n`, `\"`, `\\`, `\u00e9`, `\ud83d\ude00`, `\/`}[i%6])
			} else {
				sb.WriteByte('a' + byte(i%26))
			}
		}
		s := sb.String()
		out = append(out,
			`{"model":"m","messages":[{"role":"system","content":"`+s+`"},{"role":"user","content":"`+s[:len(s)/3]+`"}]}`,
			`{"prompt":"`+s+`"}`,
			`{"messages":[{"content":"`+s+`","role":"user"}],"instructions":"`+s[:100]+`"}`,
			`{"messages":[{"content":"`+s[:len(s)/2]+`","role":"system"},{"content":"`+s+`","name":"x","role":"user"},`+
				`{"content":[{"text":"`+s[:len(s)/5]+`","type":"text"},"`+s[:77]+`"],"role":"user"},{"role":"assistant","content":"`+s[:99]+`"}]}`)
	}
	return out
}

var testConfigs = []HashConfig{
	{},
	{BlockBytes: 16, TokenBlock: 4},
	{BlockBytes: 100, TokenBlock: 8, MaxBlocks: 3, Salt: "s"},
	{MaxBlocks: 5}, // the cap cutting the 64-byte fast path inside a piece
}

// checkLegacy compares HashBody and renderBody with the first version of
// the renderer on body.
func checkLegacy(t *testing.T, body []byte) {
	t.Helper()
	for _, cfg := range testConfigs {
		h := NewHasher(cfg)
		want, wantN, wantErr := h.legacyHashBody([]uint64{9}, "m", "a", body)
		got, n, err := h.HashBody([]uint64{9}, "m", "a", body)
		if err != nil && wantErr == nil && !json.Valid(body) {
			continue // stricter than the first version on invalid JSON (a number such as .5)
		}
		if wantErr != nil {
			require.ErrorIs(t, err, ErrBadBody, "legacy fails: %v", wantErr)
			assert.Equal(t, []uint64{9}, got)
			assert.Zero(t, n)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, wantN, n, "prompt bytes, cfg %+v", cfg)
		assert.Equal(t, want, got, "blocks, cfg %+v", cfg)
		wantText, _, _ := h.legacyRenderBody(nil, body)
		gotText, _, _ := h.renderBody(nil, body)
		assert.Equal(t, string(wantText), string(gotText), "rendered text")
	}
}

func TestHashBodyMatchesLegacy(t *testing.T) {
	for name, body := range fixtureBodies(t) {
		t.Run(filepath.Base(name), func(t *testing.T) { checkLegacy(t, body) })
	}
	for _, body := range append(append([]string{}, edgeBodies...), longBodies()...) {
		if _, escaped := plainKeys([]byte(body)); escaped {
			continue // the first version read keys raw (TestHashBodyMatchesReference covers these)
		}
		t.Run(body[:min(len(body), 40)], func(t *testing.T) { checkLegacy(t, []byte(body)) })
	}
}

func TestHashBodyMatchesReference(t *testing.T) {
	bodies := append(append([]string{}, edgeBodies...), longBodies()...)
	for _, b := range fixtureBodies(t) {
		bodies = append(bodies, string(b))
	}
	compared := 0
	for _, body := range bodies {
		ref, ok := referenceRender([]byte(body))
		if !ok {
			continue
		}
		compared++
		for _, cfg := range testConfigs {
			h := NewHasher(cfg)
			got, n, err := h.HashBody(nil, "m", "", []byte(body))
			if ref.err {
				assert.ErrorIs(t, err, ErrBadBody, body)
				continue
			}
			require.NoError(t, err, body)
			assert.Equal(t, ref.bytes, n, body)
			assert.Equal(t, ref.hash(h), got, body)
		}
	}
	assert.Greater(t, compared, 60, "most bodies are compared")
}

func TestPromptReadThenHash(t *testing.T) {
	h := NewHasher(HashConfig{BlockBytes: 16})
	pr := h.NewPrompt()
	assert.False(t, pr.Ok())
	assert.Same(t, h, pr.Hasher())
	var keys []string
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"a prompt longer than one block"}],"stream":true} trailing`)
	end, err := pr.Read(body, func(key []byte, start, end int) error {
		keys = append(keys, string(key)+"="+string(body[start:end])[:min(end-start, 4)])
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, len(body)-len(" trailing"), end, "offset after the object")
	assert.Equal(t, []string{`model="m"`, `messages=[{"r`, `stream=true`}, keys)
	assert.True(t, pr.Ok())
	want, n, err := h.HashBody(nil, "m", "lora", body)
	require.NoError(t, err)
	assert.Equal(t, n, pr.Bytes())
	assert.Equal(t, want, pr.Hash(nil, "m", "lora"))
	other, _, err := h.HashBody(nil, "m2", "", body)
	require.NoError(t, err)
	assert.Equal(t, other, pr.Hash(nil, "m2", ""), "hashed again under another model")

	stop := errors.New("stop")
	_, err = pr.Read(body, func(key []byte, _, _ int) error {
		if string(key) == "messages" {
			return stop
		}
		return nil
	})
	assert.Same(t, stop, err)
	assert.False(t, pr.Ok())
	assert.Zero(t, pr.Bytes())
	assert.Empty(t, pr.Hash(nil, "m", ""))

	_, err = pr.Read([]byte(`{"prompt":"x`), nil)
	assert.ErrorIs(t, err, ErrBadBody)
	assert.False(t, pr.Ok())

	ids := []byte(`{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`)
	_, err = pr.Read(ids, nil)
	require.NoError(t, err)
	assert.Equal(t, 17*BytesPerToken, pr.Bytes())
	want, _, _ = h.HashBody(nil, "m", "", ids)
	assert.Len(t, want, 1)
	assert.Equal(t, want, pr.Hash(nil, "m", ""))
}

// TestSyntaxErrorOffset checks the error every reader of this package
// returns for a malformed body: a *SyntaxError whose Offset is the byte
// reading stopped at, and which errors.Is matches to ErrBadBody.
func TestSyntaxErrorOffset(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user",?"content":"hi"}]}`)
	at := bytes.IndexByte(body, '?')
	h := NewHasher(HashConfig{BlockBytes: 16})
	var pr Prompt
	read := map[string]func() error{
		"HashBody": func() error { _, _, err := h.HashBody(nil, "m", "", body); return err },
		"Fields": func() error {
			_, err := Fields(body, func([]byte, int, int) error { return nil })
			return err
		},
		"Prompt.Read": func() error { _, err := pr.Read(body, nil); return err },
	}
	for name, f := range read {
		err := f()
		require.ErrorIs(t, err, ErrBadBody, name)
		var se *SyntaxError
		require.ErrorAs(t, err, &se, name)
		assert.Equal(t, at, se.Offset, name)
		assert.Equal(t, fmt.Sprintf("prefix: malformed request body at byte %d", at), err.Error(), name)
	}
}

func TestPromptTokenIDsCapped(t *testing.T) {
	h := NewHasher(HashConfig{TokenBlock: 2, MaxBlocks: 3})
	pr := h.NewPrompt()
	_, err := pr.Read([]byte(`{"prompt":[[1,2,3,4,5,6,7,8,9],[1]]}`), nil)
	require.NoError(t, err)
	assert.Len(t, pr.ids, 6, "ids beyond MaxBlocks×TokenBlock are counted, not kept")
	assert.Equal(t, 10*BytesPerToken, pr.Bytes())
	assert.Len(t, pr.Hash(nil, "m", ""), 3)
}

// FuzzAppendString checks appendString (a one-pass assembly scan on
// amd64) against appendStringGeneric for any bytes after an opening quote
// and any bytes already in dst: the same decoded string, end offset and
// verdict, and dst as given on failure.
func FuzzAppendString(f *testing.F) {
	f.Add([]byte(`hello"`), []byte{})
	f.Add([]byte(`a\nb\"c\u00e9\ud83d\ude00 and then some more text past sixteen bytes"x`), []byte("pre"))
	f.Add([]byte(`unterminated \`), []byte{})
	f.Add([]byte(`bad \q escape"`), []byte("x"))
	f.Fuzz(func(t *testing.T, rest, pre []byte) {
		b := append([]byte{'"'}, rest...)
		got, gotEnd, gotOK := appendString(slices.Clone(pre), b, 0)
		want, wantEnd, wantOK := appendStringGeneric(slices.Clone(pre), b, 0)
		if !bytes.Equal(got, want) || gotEnd != wantEnd || gotOK != wantOK {
			t.Fatalf("%q after %q: appendString %q, %d, %v; generic %q, %d, %v", b, pre, got, gotEnd, gotOK, want, wantEnd, wantOK)
		}
		if !gotOK && !bytes.Equal(got, pre) {
			t.Fatalf("%q: failed but dst changed: %q", b, got)
		}
	})
}

func FuzzHashBody(f *testing.F) {
	for _, b := range edgeBodies {
		f.Add([]byte(b))
	}
	for _, b := range fixtureBodies(f) {
		f.Add(b)
	}
	h := NewHasher(HashConfig{BlockBytes: 16, TokenBlock: 4})
	f.Fuzz(func(t *testing.T, body []byte) {
		want, wantN, wantErr := h.legacyHashBody(nil, "m", "", body)
		got, n, err := h.HashBody(nil, "m", "", body)
		if err != nil && wantErr == nil && !json.Valid(body) {
			return // stricter than the first version on invalid JSON (a number such as .5)
		}
		// The first version read keys raw; keys are decoded now, which the
		// reference below checks.
		if _, escaped := plainKeys(body); !escaped || bytes.IndexByte(body, '\\') < 0 {
			if (wantErr != nil) != (err != nil) {
				t.Fatalf("error %v, legacy %v", err, wantErr)
			}
			if err == nil && (n != wantN || !equalHashes(got, want)) {
				t.Fatalf("got %d bytes %x, legacy %d bytes %x", n, got, wantN, want)
			}
		}
		if err != nil {
			return
		}
		ref, ok := referenceRender(body)
		if !ok {
			return
		}
		if ref.err {
			t.Fatalf("reference fails, HashBody does not")
		}
		if n != ref.bytes || !equalHashes(got, ref.hash(h)) {
			t.Fatalf("got %d bytes, reference %d bytes %q", n, ref.bytes, ref.text)
		}
	})
}

func equalHashes(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// refPrompt is the reference rendering of a body.
type refPrompt struct {
	text   []byte
	ids    []int
	tokens bool
	bytes  int
	err    bool // the body's prompt fields have the wrong shape
}

func (r refPrompt) hash(h *Hasher) []uint64 {
	if r.tokens {
		return h.HashTokens(nil, "m", "", r.ids)
	}
	return h.HashText(nil, "m", "", r.text)
}

// referenceRender renders body with encoding/json, from HashBody's
// documented rules, written independently of the scanner. ok is false for
// bodies outside what it models: not valid JSON, not UTF-8, an escaped key,
// a repeated top-level key, or nesting deeper than the scanner allows.
func referenceRender(body []byte) (r refPrompt, ok bool) {
	if plain, _ := plainKeys(body); !json.Valid(body) || !utf8.Valid(body) || !plain {
		return r, false
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return r, false // not an object: the scanner's error, not modelled
	}
	rr := &refRenderer{}
	msgs, hasMsgs := top["messages"]
	prompt, hasPrompt := top["prompt"]
	input, hasInput := top["input"]
	tools, instr := top["tools"], top["instructions"]
	switch {
	case hasMsgs:
		rr.chat(tools, instr, msgs, true)
	case hasPrompt:
		rr.promptValue(prompt, nil, nil)
	case hasInput:
		rr.promptValue(input, tools, instr)
	}
	if rr.err {
		return refPrompt{err: true}, true
	}
	if !rr.tokens {
		rr.bytes += len(rr.text)
	}
	return refPrompt{text: rr.text, ids: rr.ids, tokens: rr.tokens, bytes: rr.bytes}, true
}

// plainKeys reports whether body, valid JSON, has no repeated top-level
// key and no nesting deeper than 200 (the reference's limits), and whether
// any object key has an escape.
func plainKeys(body []byte) (plain, escaped bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	type frame struct {
		object, wantKey bool
		keys            map[string]bool
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return true, escaped
		}
		if err != nil || len(stack) > 200 {
			return false, escaped
		}
		if d, isDelim := tok.(json.Delim); isDelim {
			switch d {
			case '{', '[':
				if len(stack) > 0 && stack[len(stack)-1].object {
					stack[len(stack)-1].wantKey = true
				}
				stack = append(stack, frame{object: d == '{', wantKey: d == '{', keys: map[string]bool{}})
			default:
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].object {
					stack[len(stack)-1].wantKey = true
				}
			}
			continue
		}
		if len(stack) == 0 || !stack[len(stack)-1].object {
			continue
		}
		top := &stack[len(stack)-1]
		if !top.wantKey {
			top.wantKey = true
			continue
		}
		top.wantKey = false
		key := tok.(string)
		end := int(dec.InputOffset())
		raw := `"` + key + `"`
		if end < len(raw) || string(body[end-len(raw):end]) != raw {
			escaped = true
		}
		if len(stack) == 1 {
			if top.keys[key] {
				return false, escaped
			}
			top.keys[key] = true
		}
	}
}

type refRenderer struct {
	text   []byte
	ids    []int
	tokens bool
	bytes  int
	err    bool
}

func isJSONNull(v json.RawMessage) bool { return string(v) == "null" }

func (r *refRenderer) chat(tools, instr, msgs json.RawMessage, haveMsgs bool) {
	if tools != nil && !isJSONNull(tools) {
		r.text = append(r.text, "\x1etools\x1f"...)
		r.text = append(r.text, tools...)
	}
	var s string
	if instr != nil && json.Unmarshal(instr, &s) == nil && instr[0] == '"' {
		r.text = append(r.text, "\x1esystem\x1f"...)
		r.text = append(r.text, s...)
	}
	if !haveMsgs {
		return
	}
	var items []json.RawMessage
	if msgs[0] != '[' || json.Unmarshal(msgs, &items) != nil {
		r.err = true
		return
	}
	for _, it := range items {
		r.message(it)
	}
}

func refString(v json.RawMessage) (string, bool) {
	var s string
	if v == nil || v[0] != '"' || json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

func (r *refRenderer) message(it json.RawMessage) {
	var m map[string]json.RawMessage
	if it[0] != '{' || json.Unmarshal(it, &m) != nil {
		r.err = true
		return
	}
	role, hasRole := refString(m["role"])
	content, hasContent := m["content"]
	if !hasRole && !hasContent {
		r.text = append(r.text, 0x1e, 0x1d)
		r.text = append(r.text, it...)
		return
	}
	r.text = append(r.text, 0x1e)
	r.text = append(r.text, role...)
	r.text = append(r.text, 0x1f)
	if name, ok := refString(m["name"]); ok {
		r.text = append(r.text, name...)
		r.text = append(r.text, 0x1f)
	}
	if s, ok := refString(content); ok {
		r.text = append(r.text, s...)
	} else if hasContent && content[0] == '[' {
		var parts []json.RawMessage
		_ = json.Unmarshal(content, &parts)
		for _, p := range parts {
			r.part(p)
		}
	}
	if calls, ok := m["tool_calls"]; ok && !isJSONNull(calls) {
		r.text = append(r.text, 0x1d)
		r.text = append(r.text, calls...)
	}
	if id, ok := refString(m["tool_call_id"]); ok {
		r.text = append(r.text, 0x1d)
		r.text = append(r.text, id...)
	}
}

func (r *refRenderer) part(p json.RawMessage) {
	if s, ok := refString(p); ok {
		r.text = append(r.text, s...)
		return
	}
	var m map[string]json.RawMessage
	if p[0] != '{' || json.Unmarshal(p, &m) != nil {
		r.err = true
		return
	}
	switch string(m["type"]) {
	case `"text"`, `"input_text"`, `"output_text"`:
		if s, ok := refString(m["text"]); ok {
			r.text = append(r.text, s...)
			return
		}
	}
	r.text = append(r.text, 0x1d)
	r.text = append(r.text, p...)
}

func (r *refRenderer) promptValue(v, tools, instr json.RawMessage) {
	if s, ok := refString(v); ok {
		r.chat(tools, instr, nil, false)
		r.text = append(r.text, s...)
		return
	}
	if isJSONNull(v) {
		return
	}
	var items []json.RawMessage
	if v[0] != '[' || json.Unmarshal(v, &items) != nil {
		r.err = true
		return
	}
	if len(items) == 0 {
		return
	}
	switch items[0][0] {
	case '{':
		r.chat(tools, instr, v, true)
	case '"':
		for i, it := range items {
			s, ok := refString(it)
			if !ok {
				r.err = true
				return
			}
			if i == 0 {
				r.text = append(r.text, s...)
			} else {
				r.bytes += len(s)
			}
		}
	case '[':
		r.tokens = true
		total := 0
		for i, it := range items {
			var arr []json.RawMessage
			if it[0] != '[' || json.Unmarshal(it, &arr) != nil {
				r.err = true
				return
			}
			for _, x := range arr {
				n, ok := refInt(x)
				if !ok {
					r.err = true
					return
				}
				if i == 0 {
					r.ids = append(r.ids, n)
				}
			}
			total += len(arr)
		}
		r.bytes = total * BytesPerToken
	default:
		r.tokens = true
		for _, x := range items {
			n, ok := refInt(x)
			if !ok {
				r.err = true
				return
			}
			r.ids = append(r.ids, n)
		}
		r.bytes = len(r.ids) * BytesPerToken
	}
}

// refInt reads a JSON integer of at most 19 digits (wrapping like the
// scanner beyond int64; only the digits matter to the hash).
func refInt(x json.RawMessage) (int, bool) {
	s := string(x)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	if s == "" || len(s) > 19 {
		return 0, false
	}
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// TestEscapedKeysHashAsPlain: a key is read with its escapes decoded, as
// the model server reads it, so the prompt of a body that spells
// "messages" with an escape is the prompt, not an unknown field.
func TestEscapedKeysHashAsPlain(t *testing.T) {
	h := NewHasher(HashConfig{BlockBytes: 16})
	plain, n, err := h.HashBody(nil, "m", "", []byte(`{"messages":[{"role":"user","content":"a prompt long enough for blocks"}]}`))
	require.NoError(t, err)
	require.NotEmpty(t, plain)
	escaped, n2, err := h.HashBody(nil, "m", "", []byte(`{"mess\u0061ges":[{"r\u006fle":"user","cont\u0065nt":"a prompt long enough for blocks"}]}`))
	require.NoError(t, err)
	assert.Equal(t, n, n2)
	assert.Equal(t, plain, escaped)
}

func TestFields(t *testing.T) {
	tests := []struct {
		name, body string
		want       []string // key=value
		end        int      // offset after the object; -1: len(body)
		bad        bool
	}{
		{"empty", ` {} `, nil, 3, false},
		{"kinds", `{"a":1,"b":-2.5e3,"c":"s\"q","d":[1,{"x":null}],"e":{"f":true},"g":false}`,
			[]string{`a=1`, `b=-2.5e3`, `c="s\"q"`, `d=[1,{"x":null}]`, `e={"f":true}`, `g=false`}, -1, false},
		{"keys decoded", `{"m\u0061":1,"\"":2}`, []string{`ma=1`, `"=2`}, -1, false},
		{"bad escape in a key", `{"m\x":1}`, nil, 0, true},
		{"trailing data is not read", `{"a":1} x`, []string{`a=1`}, 7, false},
		{"not an object", `[1]`, nil, 0, true},
		{"empty body", ``, nil, 0, true},
		{"unterminated", `{"a":"x}`, nil, 0, true},
		{"number without a digit first", `{"a":.5}`, nil, 0, true},
		{"plus sign", `{"a":+1}`, nil, 0, true},
		{"bad literal", `{"a":tru}`, nil, 0, true},
		{"missing colon", `{"a" 1}`, nil, 0, true},
		{"missing comma", `{"a":1 "b":2}`, nil, 0, true},
		{"too deep", `{"a":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `}`, nil, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			var got []string
			end, err := Fields(body, func(key []byte, start, end int) error {
				got = append(got, string(key)+"="+string(body[start:end]))
				return nil
			})
			if tc.bad {
				require.ErrorIs(t, err, ErrBadBody)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			if tc.end < 0 {
				tc.end = len(body)
			}
			assert.Equal(t, tc.end, end)
		})
	}
	stop := errors.New("stop")
	n := 0
	_, err := Fields([]byte(`{"a":1,"b":2,"c":3}`), func([]byte, int, int) error {
		if n++; n == 2 {
			return stop
		}
		return nil
	})
	assert.Same(t, stop, err)
	assert.Equal(t, 2, n, "no key after the error")
}
