package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// jsonReading is encoding/json's reading of a request body: whether it is
// a valid JSON object, and the model/stream/user it decodes (the last of
// duplicate keys, escapes decoded).
type jsonReading struct {
	object    bool // json.Valid and the top-level value is an object
	hasModel  bool
	model     string
	modelStr  bool // the model value decodes into a string (null excluded)
	hasStream bool
	stream    bool
	streamOK  bool
	user      string
}

func jsonRef(body []byte) jsonReading {
	var o jsonReading
	if !json.Valid(body) {
		return o
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return o
	}
	o.object = true
	if v, ok := m["model"]; ok {
		o.hasModel = true
		o.modelStr = len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &o.model) == nil
	}
	if v, ok := m["stream"]; ok {
		o.hasStream = true
		o.streamOK = json.Unmarshal(v, &o.stream) == nil
	}
	if v, ok := m["user"]; ok {
		_ = json.Unmarshal(v, &o.user)
	}
	return o
}

// parseBoth parses with both entry points, each with a fresh Prompt.
func parseBoth(body []byte) (p1 Parsed, err1 error, p2 Parsed, err2 error) {
	p1, err1 = ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
	pr := prefix.NewHasher(prefix.HashConfig{}).NewPrompt()
	p2, err2 = ParseRequestPrompt("/v1/chat/completions", nil, body, ParseOptions{}, pr)
	return
}

// TestParseOracleHandWritten compares ParseRequest with encoding/json on
// hand-written bodies whose every value is one the scanner reads (model,
// stream, keys) or structure: here the scanner must agree exactly.
func TestParseOracleHandWritten(t *testing.T) {
	bodies := []string{
		`{}`, ` {} `, "\t\r\n{\"model\":\"m\"}\n", `{"model":"m"}`,
		`{"model":"a\"b"}`, `{"model":"a\\b"}`, `{"model":"a\/b"}`, `{"model":"\u00e9"}`,
		`{"model":"\ud83d\ude00"}`, `{"model":"\ud83d"}`, `{"model":"\ude00"}`, `{"model":"\ud83dx"}`,
		`{"model":"\ud83d\u0041"}`, `{"model":"\ud83d\ud83d\ude00"}`, `{"model":"\u0000"}`,
		`{"model":"a\\"}`, `{"model":"\\\"\\"}`, `{"model":"\b\f\n\r\t"}`, `{"model":"\U0041"}`,
		`{"model":"\x41"}`, `{"model":"\u12"}`, `{"model":"\u12G4"}`,
		`{"mod\u0065l":"m"}`, `{"mod\u0065l":"a","model":"b"}`, `{"model":"a","mod\u0065l":"b"}`,
		`{"\u006d\u006f\u0064\u0065\u006c":"x"}`, `{"model\u0000":"x"}`, `{"Model":"x"}`,
		`{"model":"a","model":"b"}`, `{"model":"a","model":"b","model":"c"}`,
		`{"stream":true,"stream":false}`, `{"stream":false,"stream":true}`, `{"stream":null}`,
		`{"user":"u","user":"v"}`, `{"user":"\u0075"}`,
		`{"model":"m",}`, `{,"model":"m"}`, `{"model":"m""stream":true}`, `{"model":"m" "x":1}`,
		`{"model":"m"}}`, `{"model":"m"}]`, `{"model":"m"},`, `{"model":"m"}{}`, `{"model":"m"} x`,
		`{"model":"m"`, `{"model":`, `{"model"`, `{"model`, `{`, `{"a":[}`, `{"a":[1,]}`, `{"a":[,1]}`,
		`{"a":{"b"}}`, `{"a":{"b":}}`, `{"a":{1:2}}`, `{"a":{"b":1,}}`, `{"a":[1 2]}`, `{"a":tru}`, `{"a":truee}`,
		`{"a":nul}`, `{"a":NULL}`, `{"a":True}`, `{"a":[true,false,null]}`, `{"a":"\""}`, `{'a':1}`,
		`{"a":1}` + "\x00", `{"a":1}` + "\v", `{"a":1}` + "\f", "{\"a\":\v1}", "{\"a\":\f1}",
		`{"a":[[[[[[[[[[]]]]]]]]]]}`, `{"a":{"b":{"c":{"d":[{}]}}}}`,
		`{"a":0}`, `{"a":-0}`, `{"a":-0.0}`, `{"a":1e999}`, `{"a":1E+2}`, `{"a":1e-2}`, `{"a":123456789012345678901234567890}`,
		`{"model":"m","stream":true}`, `{"stream":true,"model":"m"}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:x"}}]}]}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"r"}]}`,
		`{"model":"m","input":"hello"}`, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]}`,
		`{"model":"m","input":[{"type":"function_call","call_id":"x","name":"f","arguments":"{}"}]}`,
		`{"model":"m","prompt":[1,2,3]}`, `{"model":"m","prompt":["a","b"]}`, `{"model":"m","input":[[1,2],[3]]}`,
		`{"stream":"true"}`, `{"stream":1}`, `{"stream":[]}`, `{"model":null}`, `{"model":42}`, `{"model":["m"]}`,
		`{"model":{"name":"m"}}`, `{"model":true}`, `{"model":42,"model":"m"}`, `{"model":"m","model":42}`,
		`{"user":42}`, `{"user":null,"user":"u"}`, `{"max_tokens":-1}`, `{"max_tokens":"5"}`,
	}
	for _, b := range bodies {
		body := []byte(b)
		t.Run(fmt.Sprintf("%q", b), func(t *testing.T) {
			ref := jsonRef(body)
			p1, err1, p2, err2 := parseBoth(body)
			for i, r := range []struct {
				p   Parsed
				err error
			}{{p1, err1}, {p2, err2}} {
				name := []string{"ParseRequest", "ParseRequestPrompt"}[i]
				if !r.p.JSON {
					assert.False(t, ref.object, "%s: a JSON object read as not JSON", name)
					continue
				}
				var fe *fieldError
				switch {
				case ref.object && r.err != nil && !errors.As(r.err, &fe):
					t.Errorf("%s: valid JSON object rejected: %v", name, r.err)
				case !ref.object && r.err == nil:
					t.Errorf("%s: invalid JSON accepted as model %q", name, r.p.Model)
				case ref.object && r.err == nil:
					if ref.hasModel && ref.modelStr {
						assert.Equal(t, ref.model, r.p.Model, "%s: model", name)
					}
					assert.Equal(t, ref.hasModel && ref.modelStr, r.p.HasModel(), "%s: HasModel", name)
					if ref.streamOK {
						assert.Equal(t, ref.stream, r.p.Stream, "%s: stream", name)
					}
					assert.Equal(t, ref.user, r.p.SessionKey, "%s: session key (user)", name)
				case ref.object && r.err != nil:
					// A known field of the wrong type: some occurrence of it
					// must not decode into the Go type.
					assert.True(t, someWrongType(body, fe.field), "%s: %v", name, r.err)
				}
			}
		})
	}
}

// TestParseModelCheckedAsEncodingJSON: ParseRequest's documentation
// says the fields it reads are "checked and decoded as encoding/json would";
// only the strings and numbers it skips are left unchecked. The model is
// read, so a model string encoding/json rejects (a raw control character)
// or decodes differently (invalid UTF-8 becomes U+FFFD) must not route.
func TestParseModelCheckedAsEncodingJSON(t *testing.T) {
	t.Run("raw control character in model", func(t *testing.T) {
		body := []byte("{\"model\":\"gpt\x01x\"}")
		require.False(t, json.Valid(body), "encoding/json rejects a raw control character in a string")
		p, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
		assert.ErrorIs(t, err, ErrMalformed, "model read as %q", p.Model)
	})
	t.Run("raw newline in model", func(t *testing.T) {
		body := []byte("{\"model\":\"a\nb\"}")
		require.False(t, json.Valid(body))
		p, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
		assert.ErrorIs(t, err, ErrMalformed, "model read as %q", p.Model)
	})
	t.Run("invalid UTF-8 in model", func(t *testing.T) {
		body := []byte("{\"model\":\"m\xff\"}")
		var ref struct{ Model string }
		require.NoError(t, json.Unmarshal(body, &ref))
		p, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
		require.NoError(t, err)
		assert.Equal(t, ref.Model, p.Model, "encoding/json decodes invalid UTF-8 as U+FFFD")
	})
	t.Run("same model with an escape is checked", func(t *testing.T) {
		// With a backslash in the value, stringValue defers to json.Unmarshal,
		// which rejects the control character: the check depends on an
		// unrelated escape.
		body := []byte("{\"model\":\"gpt\x01\\u0078\"}")
		_, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
		assert.ErrorIs(t, err, ErrMalformed)
	})
}

// TestParseMaxTokensNumberSyntax: max_tokens is a field ParseRequest reads,
// so its number is checked as encoding/json would; strconv alone accepts
// spellings JSON does not.
func TestParseMaxTokensNumberSyntax(t *testing.T) {
	for _, v := range []string{"01", "1.", "-01", "00", "1.e2"} {
		t.Run(v, func(t *testing.T) {
			body := []byte(`{"max_tokens":` + v + `}`)
			require.False(t, json.Valid(body))
			p, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
			assert.ErrorIs(t, err, ErrMalformed, "accepted as max_tokens %d", p.MaxOutputTokens)
		})
	}
	// Spellings JSON accepts are read (a zero fraction is accepted by design).
	for v, want := range map[string]int{"0": 0, "-0": 0, "1e2": 100, "1E+2": 100, "1.0": 1, "100e-2": 1} {
		p, err := ParseRequest("/v1/chat/completions", nil, []byte(`{"max_tokens":`+v+`}`), ParseOptions{})
		require.NoError(t, err, v)
		assert.Equal(t, want, p.MaxOutputTokens, v)
	}
	for _, v := range []string{"1e999", "1e20", "9223372036854775808", "-1", "1.5", "true", `"5"`} {
		_, err := ParseRequest("/v1/chat/completions", nil, []byte(`{"max_tokens":`+v+`}`), ParseOptions{})
		assert.ErrorIs(t, err, ErrMalformed, v)
		assert.Equal(t, "max_tokens", param(err), v)
	}
}

// TestParseModelNull: a request with no model takes the fallback route;
// "model": null is no model to encoding/json (a string field is left
// empty), and ParseRequest itself treats "stream": null and
// "max_tokens": null as absent.
func TestParseModelNull(t *testing.T) {
	body := []byte(`{"model":null,"messages":[{"role":"user","content":"hi"}]}`)
	var ref struct{ Model string }
	require.NoError(t, json.Unmarshal(body, &ref))
	p, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
	require.NoError(t, err, "model null should be no model (fallback route), not a 400")
	assert.False(t, p.HasModel())
}

// TestParseDepthLimitAgrees: ParseRequest and ParseRequestPrompt must
// accept and reject the same bodies (FuzzParseRequest: "ParseRequest
// fails, ParseRequestPrompt does not" is a failure), also at the nesting
// limit, which the renderer of messages and content parts must count as
// Fields counts it.
func TestParseDepthLimitAgrees(t *testing.T) {
	for _, k := range []int{254, 255, 256, 257} {
		nest := strings.Repeat("[", k) + strings.Repeat("]", k)
		for name, body := range map[string]string{
			"message field": `{"messages":[{"role":"user","content":"x","x":` + nest + `}]}`,
			"content part":  `{"messages":[{"role":"user","content":[{"type":"x","x":` + nest + `}]}]}`,
			"tools":         `{"tools":` + nest + `}`,
		} {
			t.Run(fmt.Sprintf("%s/%d", name, k), func(t *testing.T) {
				_, err1, _, err2 := parseBoth([]byte(body))
				assert.Equal(t, err1 == nil, err2 == nil, "ParseRequest err %v, ParseRequestPrompt err %v", err1, err2)
			})
		}
	}
	// encoding/json accepts these; the 256-level limit is documented on
	// prefix.Fields. Far deeper bodies must be rejected, not crash.
	deep := []byte(`{"x":` + strings.Repeat("[", 1_000_000) + `}`)
	_, err1, _, err2 := parseBoth(deep)
	assert.ErrorIs(t, err1, ErrMalformed)
	assert.ErrorIs(t, err2, ErrMalformed)
	deep = []byte(`{"messages":[{"content":` + strings.Repeat(`[{"type":"x","c":`, 100_000) + `}]}`)
	_, err1, _, err2 = parseBoth(deep)
	assert.ErrorIs(t, err1, ErrMalformed)
	assert.ErrorIs(t, err2, ErrMalformed)
}

// TestParseEscapedKeysLinear: the documentation promises a cost linear in
// the body. A key with an escape is decoded into a new slice; sized by the
// rest of the body instead of the key, N escaped keys allocated (and
// cleared) O(N * len(body)) bytes: 2.3 GB for a 220 KB body.
func TestParseEscapedKeysLinear(t *testing.T) {
	for name, mk := range map[string]func(n int) []byte{
		"top-level keys": func(n int) []byte {
			var b bytes.Buffer
			b.WriteString(`{"model":"m"`)
			for range n {
				b.WriteString(`,"\u0061":0`)
			}
			b.WriteString(`}`)
			return b.Bytes()
		},
		"message keys": func(n int) []byte {
			var b bytes.Buffer
			b.WriteString(`{"model":"m","messages":[{"r\u006fle":"user","content":"x"}`)
			for range n - 1 {
				b.WriteString(`,{"r\u006fle":"user"}`)
			}
			b.WriteString(`]}`)
			return b.Bytes()
		},
	} {
		t.Run(name, func(t *testing.T) {
			body := mk(20_000)
			pr := prefix.NewHasher(prefix.HashConfig{}).NewPrompt()
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			before := ms.TotalAlloc
			start := time.Now()
			_, err := ParseRequestPrompt("/v1/chat/completions", nil, body, ParseOptions{}, pr)
			elapsed := time.Since(start)
			runtime.ReadMemStats(&ms)
			require.NoError(t, err)
			allocated := ms.TotalAlloc - before
			t.Logf("body %d bytes: %d bytes allocated (%.0fx), %v", len(body), allocated, float64(allocated)/float64(len(body)), elapsed)
			assert.Less(t, allocated, uint64(64*len(body)), "allocation should be linear in the body")
		})
	}
}

// TestParseDuplicateKeysLastWins: encoding/json (and the Python JSON
// readers of model servers) keep the last of duplicate keys, and so do
// ParseRequest for every field it reads and the prompt renderer for the
// messages it hashes.
func TestParseDuplicateKeysLastWins(t *testing.T) {
	h := prefix.NewHasher(prefix.HashConfig{BlockBytes: 16})
	t.Run("model stream user", func(t *testing.T) {
		body := []byte(`{"model":"a","stream":true,"user":"u1","model":"b","stream":false,"user":"u2"}`)
		for _, p := range []func() (Parsed, error){
			func() (Parsed, error) { return ParseRequest("/v1/chat/completions", nil, body, ParseOptions{}) },
			func() (Parsed, error) {
				return ParseRequestPrompt("/v1/chat/completions", nil, body, ParseOptions{}, h.NewPrompt())
			},
		} {
			got, err := p()
			require.NoError(t, err)
			assert.Equal(t, "b", got.Model)
			assert.False(t, got.Stream)
			assert.Equal(t, "u2", got.SessionKey)
		}
	})
	t.Run("a wrong type replaced", func(t *testing.T) {
		// Only the last value is read, so only its type matters.
		for body, want := range map[string]Parsed{
			`{"model":42,"model":"m"}`:                        {Model: "m"},
			`{"stream":"yes","stream":true}`:                  {Stream: true},
			`{"max_tokens":"5","max_tokens":7}`:               {MaxOutputTokens: 7},
			`{"max_tokens":-1,"max_tokens":null}`:             {},
			`{"model":["m"],"model":null,"x":1}`:              {},
			`{"max_output_tokens":1.5,"max_output_tokens":2}`: {MaxOutputTokens: 2},
		} {
			got, err := ParseRequest("/v1/chat/completions", nil, []byte(body), ParseOptions{})
			require.NoError(t, err, body)
			assert.Equal(t, want.Model, got.Model, body)
			assert.Equal(t, want.Stream, got.Stream, body)
			assert.Equal(t, want.MaxOutputTokens, got.MaxOutputTokens, body)
			_, err = ParseRequestPrompt("/v1/chat/completions", nil, []byte(body), ParseOptions{}, h.NewPrompt())
			assert.NoError(t, err, body)
		}
		for _, body := range []string{`{"model":"m","model":42}`, `{"stream":true,"stream":"yes"}`, `{"max_tokens":7,"max_tokens":"5"}`} {
			_, err := ParseRequest("/v1/chat/completions", nil, []byte(body), ParseOptions{})
			var fe *fieldError
			assert.ErrorAs(t, err, &fe, body)
		}
	})
	t.Run("prompt", func(t *testing.T) {
		cases := []struct{ dup, last string }{
			{`{"prompt":"first prompt text that is long","prompt":"second"}`, `{"prompt":"second"}`},
			{`{"prompt":[1,2,3],"prompt":"second"}`, `{"prompt":"second"}`},
			{`{"prompt":"first","prompt":[4,5]}`, `{"prompt":[4,5]}`},
			{`{"input":"first","input":"second"}`, `{"input":"second"}`},
			{`{"messages":null,"messages":[{"role":"user","content":"second"}]}`, `{"messages":[{"role":"user","content":"second"}]}`},
			{`{"messages":[{"role":"user","content":"first message, long enough for blocks"}],"messages":[{"role":"user","content":"second"}]}`,
				`{"messages":[{"role":"user","content":"second"}]}`},
			{`{"messages":[{"role":"user","content":"first","content":"second"}]}`, `{"messages":[{"role":"user","content":"second"}]}`},
			{`{"messages":[{"role":"system","content":"x","role":"user"}]}`, `{"messages":[{"role":"user","content":"x"}]}`},
		}
		for _, tc := range cases {
			want, wn, err := h.HashBody(nil, "m", "", []byte(tc.last))
			require.NoError(t, err)
			got, gn, err := h.HashBody(nil, "m", "", []byte(tc.dup))
			require.NoError(t, err, tc.dup)
			assert.Equal(t, want, got, "blocks of %s should be those of %s", tc.dup, tc.last)
			assert.Equal(t, wn, gn, "rendered bytes of %s", tc.dup)
		}
	})
	t.Run("stream_options.include_usage", func(t *testing.T) {
		for body, want := range map[string]bool{
			`{"stream_options":{"include_usage":true},"stream_options":{"include_usage":false}}`: false,
			`{"stream_options":{"include_usage":true},"stream_options":null}`:                    false,
			`{"stream_options":{"include_usage":true,"include_usage":false}}`:                    false,
			`{"stream_options":{"include_usage":false,"include_usage":true}}`:                    true,
		} {
			var ref struct {
				StreamOptions *struct {
					IncludeUsage bool `json:"include_usage"`
				} `json:"stream_options"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &ref))
			require.Equal(t, want, ref.StreamOptions != nil && ref.StreamOptions.IncludeUsage, body)
			p, err := ParseRequest("/v1/chat/completions", nil, []byte(body), ParseOptions{})
			require.NoError(t, err)
			assert.Equal(t, want, p.IncludeUsage, body)
		}
	})
	t.Run("max_tokens", func(t *testing.T) {
		for body, want := range map[string]int{
			`{"max_tokens":5,"max_tokens":7}`:                                      7,
			`{"max_tokens":5,"max_tokens":null}`:                                   0,
			`{"max_completion_tokens":5,"max_completion_tokens":null}`:             0,
			`{"max_completion_tokens":5,"max_tokens":9,"max_completion_tokens":6}`: 6,
		} {
			p, err := ParseRequest("/v1/chat/completions", nil, []byte(body), ParseOptions{})
			require.NoError(t, err)
			assert.Equal(t, want, p.MaxOutputTokens, body)
		}
	})
}

// TestParseRewriteModel: the rewritten body is valid JSON, decodes to
// the original with only the model changed, and parses back to the new
// name, for awkward bodies and names.
func TestParseRewriteModel(t *testing.T) {
	bodies := []string{
		`{"model":"alias"}`, ` { "model" : "alias" } `, "{\n\t\"model\":\t\"alias\"\r\n}",
		`{"messages":[{"role":"user","content":"\"model\":\"x\""}],"model":"alias","stream":true}`,
		`{"model":"x","model":"alias"}`, `{"mod\u0065l":"alias"}`, `{"model":"ali\u0061s"}`, `{"model":"a\/b"}`,
		`{"x":{"model":"nested"},"model":"alias","y":["model"]}`, `{"model":"\ud83d\ude00"}`, `{"model":""}`,
	}
	tos := []string{"served", `q"uote`, `back\slash`, "ctl\x00\x1f\x7f", "nl\n\r\t", "uni\u00e9\u2028\u2029\U0001F600", "</script>&", ""}
	for _, b := range bodies {
		body := []byte(b)
		for _, to := range tos {
			p, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
			require.NoError(t, err, b)
			require.True(t, p.HasModel(), b)
			out := p.RewriteModel(body, to)
			require.True(t, json.Valid(out), "%q -> %q", b, out)
			var before, after map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(body, &before))
			require.NoError(t, json.Unmarshal(out, &after))
			var m string
			require.NoError(t, json.Unmarshal(after["model"], &m))
			assert.Equal(t, to, m, "%q -> %q", b, out)
			delete(before, "model")
			delete(after, "model")
			assert.Equal(t, before, after, "only the model changes: %q -> %q", b, out)
			q, err := ParseRequest("/v1/chat/completions", nil, out, ParseOptions{})
			require.NoError(t, err)
			assert.Equal(t, to, q.Model)
			assert.Equal(t, b, string(body), "the original is untouched")
		}
	}
	// No model: the body itself.
	body := []byte(`{"messages":[]}`)
	p, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
	require.NoError(t, err)
	assert.Same(t, &body[0], &p.RewriteModel(body, "x")[0])
}

// TestParseTokenEstimate checks Prepare's token estimate: rendered
// bytes / 4 for text, the exact number of ids for token-id prompts (every
// prompt of a batch counted), for each API's prompt shapes.
func TestParseTokenEstimate(t *testing.T) {
	h := prefix.NewHasher(prefix.HashConfig{})
	s400 := strings.Repeat("abcd", 100)
	ids := func(n int) string {
		var b strings.Builder
		b.WriteByte('[')
		for i := range n {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprint(&b, 1000+i)
		}
		b.WriteByte(']')
		return b.String()
	}
	cases := []struct {
		path, body string
		want       int
	}{
		{"/v1/completions", `{"model":"m","prompt":"` + s400 + `"}`, 100},
		{"/v1/completions", `{"model":"m","prompt":"` + strings.Repeat(`\u0041`, 40) + `"}`, 10}, // decoded chars
		{"/v1/completions", `{"model":"m","prompt":` + ids(37) + `}`, 37},
		{"/v1/completions", `{"model":"m","prompt":[` + ids(5) + `,` + ids(7) + `,[]]}`, 12},
		{"/v1/completions", `{"model":"m","prompt":["` + s400 + `","` + s400 + `"]}`, 200},
		{"/v1/completions", `{"model":"m","prompt":[]}`, 0},
		{"/v1/completions", `{"model":"m","prompt":null}`, 0},
		{"/v1/embeddings", `{"model":"m","input":"` + s400 + `"}`, 100},
		{"/v1/embeddings", `{"model":"m","input":[` + ids(3) + `,` + ids(4) + `]}`, 7},
		{"/v1/embeddings", `{"model":"m","input":` + ids(9) + `}`, 9},
		{"/v1/responses", `{"model":"m","input":"` + s400 + `"}`, 100},
		{"/v1/responses", `{"input":"` + s400 + `","model":"m","stream":true}`, 100},
	}
	for _, tc := range cases {
		t.Run(tc.path+" "+tc.body[:min(len(tc.body), 60)], func(t *testing.T) {
			body := []byte(tc.body)
			for _, pr := range []*prefix.Prompt{nil, h.NewPrompt()} {
				p, err := ParseRequestPrompt(tc.path, nil, body, ParseOptions{}, pr)
				require.NoError(t, err)
				var req signals.Request
				require.NoError(t, Prepare(&req, &p, Route{Model: "m"}, body, nil, h, nil))
				assert.Equal(t, tc.want, req.PromptTokens, "one pass: %v", pr != nil)
			}
		})
	}
	// A chat prompt counts its rendered bytes (role, separators, text parts,
	// other parts as raw JSON): more than the text, and the same either way.
	body := []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + s400 +
		`"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]},{"role":"assistant","content":null,` +
		`"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}]}`)
	var r1, r2 signals.Request
	p1, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
	require.NoError(t, err)
	require.NoError(t, Prepare(&r1, &p1, Route{Model: "m"}, body, nil, h, nil))
	p2, err := ParseRequestPrompt("/v1/chat/completions", nil, body, ParseOptions{}, h.NewPrompt())
	require.NoError(t, err)
	require.NoError(t, Prepare(&r2, &p2, Route{Model: "m"}, body, nil, h, nil))
	assert.Equal(t, r1.PromptTokens, r2.PromptTokens)
	assert.Equal(t, r1.PromptBlocks, r2.PromptBlocks)
	assert.Greater(t, r1.PromptTokens, 100)
	assert.Less(t, r1.PromptTokens, len(body)/4+1)
	// Not JSON: no prompt, no error.
	var r3 signals.Request
	p3, err := ParseRequest("/v1/chat/completions", nil, []byte("hello"), ParseOptions{})
	require.NoError(t, err)
	require.NoError(t, Prepare(&r3, &p3, Route{}, []byte("hello"), nil, h, nil))
	assert.Zero(t, r3.PromptTokens)
}

// TestParseNonObjectBodies: bodies that are not a JSON object
// (empty, text, arrays, scalars, a BOM, non-JSON whitespace) take the
// fallback route (JSON false, no error); an object body with garbage is a
// 400; none panics.
func TestParseNonObjectBodies(t *testing.T) {
	tab, err := NewTable(TableConfig{Pools: []PoolConfig{{Name: "p", Picker: newTestPicker(t), Models: []string{"m"}}}})
	require.NoError(t, err)
	for _, b := range []string{"", " ", "\n\t", "hello", `[{"model":"m"}]`, `"model"`, `42`, `null`, `true`,
		"\xef\xbb\xbf{\"model\":\"m\"}", "\v{\"model\":\"m\"}", "\f{}", "\x00{}", "\xff\xfe{\x00"} {
		for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/health"} {
			p, err := ParseRequest(path, nil, []byte(b), ParseOptions{})
			require.NoError(t, err, "%q", b)
			assert.False(t, p.JSON, "%q", b)
			rt, err := tab.Route(&p)
			require.NoError(t, err)
			assert.True(t, rt.Fallback)
		}
	}
	for _, b := range []string{"{", "{\xef\xbb\xbf}", `{"model":"m"} {"model":"n"}`, `{"model":"m"}` + "\x00", `{} []`} {
		_, err := ParseRequest("/v1/chat/completions", nil, []byte(b), ParseOptions{})
		assert.ErrorIs(t, err, ErrMalformed, "%q", b)
		assert.Equal(t, 400, errorFor(err, 0).Status)
	}
}

// TestParseTable probes NewTable with names that collide across
// models, adapters and aliases, and the /v1/models body.
func TestParseTable(t *testing.T) {
	pk := newTestPicker(t)
	bad := map[string]TableConfig{
		"alias named like a model of its pool": {Pools: []PoolConfig{{Name: "a", Picker: pk, Models: []string{"m", "n"},
			Aliases: map[string]string{"m": "n"}}}},
		"alias named like a model of another pool": {Pools: []PoolConfig{{Name: "a", Picker: pk, Models: []string{"m"}},
			{Name: "b", Picker: pk, Models: []string{"n"}, Aliases: map[string]string{"m": "n"}}}},
		"adapter named like a model of another pool": {Pools: []PoolConfig{{Name: "a", Picker: pk, Models: []string{"m"}},
			{Name: "b", Picker: pk, Models: []string{"n"}, Adapters: map[string]string{"m": "n"}}}},
		"alias named like an adapter": {Pools: []PoolConfig{{Name: "a", Picker: pk, Models: []string{"m"},
			Adapters: map[string]string{"l": "m"}, Aliases: map[string]string{"l": "m"}}}},
		"alias to itself": {Pools: []PoolConfig{{Name: "a", Picker: pk, Models: []string{"m"}, Aliases: map[string]string{"x": "x"}}}},
		"alias to an alias": {Pools: []PoolConfig{{Name: "a", Picker: pk, Models: []string{"m"},
			Aliases: map[string]string{"x": "m", "y": "x"}}}},
		"model declared twice in a pool": {Pools: []PoolConfig{{Name: "a", Picker: pk, Models: []string{"m", "m"}}}},
		"empty model name":               {Pools: []PoolConfig{{Name: "a", Picker: pk, Models: []string{""}}}},
		"empty alias name":               {Pools: []PoolConfig{{Name: "a", Picker: pk, Models: []string{"m"}, Aliases: map[string]string{"": "m"}}}},
		"empty adapter name":             {Pools: []PoolConfig{{Name: "a", Picker: pk, Models: []string{"m"}, Adapters: map[string]string{"": "m"}}}},
	}
	for name, cfg := range bad {
		_, err := NewTable(cfg)
		assert.Error(t, err, name)
	}

	// Hundreds of models, adapters and aliases across pools, each routing
	// where it was declared; the /v1/models body lists every one.
	var pools []PoolConfig
	for i := range 200 {
		base := fmt.Sprintf("org/model-%d", i)
		pools = append(pools, PoolConfig{Name: fmt.Sprintf("pool-%d", i), Picker: pk, Models: []string{base},
			Adapters: map[string]string{fmt.Sprintf("lora-%d", i): base},
			Aliases:  map[string]string{fmt.Sprintf("alias-%d", i): base, fmt.Sprintf("lalias-%d", i): fmt.Sprintf("lora-%d", i)}})
	}
	tab, err := NewTable(TableConfig{Pools: pools, Fallback: "pool-7"})
	require.NoError(t, err)
	for _, i := range []int{0, 99, 199} {
		pool := tab.Pool(fmt.Sprintf("pool-%d", i))
		base := fmt.Sprintf("org/model-%d", i)
		for client, want := range map[string]Route{
			base:                        {Pool: pool, ClientModel: base, Model: base},
			fmt.Sprintf("lora-%d", i):   {Pool: pool, ClientModel: fmt.Sprintf("lora-%d", i), Model: base, Adapter: fmt.Sprintf("lora-%d", i)},
			fmt.Sprintf("alias-%d", i):  {Pool: pool, ClientModel: fmt.Sprintf("alias-%d", i), Model: base, Upstream: base},
			fmt.Sprintf("lalias-%d", i): {Pool: pool, ClientModel: fmt.Sprintf("lalias-%d", i), Model: base, Adapter: fmt.Sprintf("lora-%d", i), Upstream: fmt.Sprintf("lora-%d", i)},
		} {
			body, _ := json.Marshal(map[string]any{"model": client, "stream": true})
			p, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
			require.NoError(t, err)
			rt, err := tab.Route(&p)
			require.NoError(t, err)
			assert.Equal(t, want, rt)
		}
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string  `json:"id"`
			Root   string  `json:"root"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(tab.ModelsJSON(), &list))
	assert.Len(t, list.Data, 800)
	p, err := ParseRequest("/v1/chat/completions", nil, []byte(`{"messages":[]}`), ParseOptions{})
	require.NoError(t, err)
	rt, err := tab.Route(&p)
	require.NoError(t, err)
	assert.Equal(t, Route{Pool: tab.Pool("pool-7"), Fallback: true}, rt)
	// Lookups are exact: no case folding, no trimming, no prefix match.
	for _, m := range []string{"ORG/MODEL-1", " org/model-1", "org/model-1 ", "org/model-", "lora-1/x"} {
		_, ok := tab.Lookup(m)
		assert.False(t, ok, m)
	}
}

// TestParseModelsJSONEmptyTable: a table may have pools without any
// declared model (a fallback-only gateway); GET /v1/models must still be
// the OpenAI list shape, whose "data" is an array, not null, which OpenAI
// clients (openai-python's SyncPage.data: List[Model]) reject.
func TestParseModelsJSONEmptyTable(t *testing.T) {
	tab, err := NewTable(TableConfig{Pools: []PoolConfig{{Name: "catch-all", Picker: newTestPicker(t)}}})
	require.NoError(t, err)
	var list map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(tab.ModelsJSON(), &list))
	assert.Equal(t, "[]", string(list["data"]), "body %s", tab.ModelsJSON())
}

// TestParseResponsesStreamModelRewrittenBack: with an alias the
// response's "model" is rewritten back to the client's name "in JSON and
// in every SSE chunk". In a /v1/responses stream the response's model is
// in the event's "response" object (response.created, response.completed:
// the fixture responses-stream.response.sse), where parseUsage also
// looks for the usage; TestProxyModelRewrite runs the whole stream.
func TestParseResponsesStreamModelRewrittenBack(t *testing.T) {
	ev := []byte(`{"type":"response.completed","response":{"id":"resp_1","model":"served-name","object":"response",` +
		`"status":"completed","usage":{"input_tokens":5,"output_tokens":2}}}`)
	u, ok := parseUsage(ev)
	require.True(t, ok, "the usage is read from the nested response")
	assert.Equal(t, usage{prompt: 5, completion: 2}, u)
	out := rewriteModelField(ev, "client-alias")
	var got struct {
		Response struct {
			Model string `json:"model"`
		} `json:"response"`
	}
	require.NoError(t, json.Unmarshal(out, &got))
	assert.Equal(t, "client-alias", got.Response.Model, "the response's model is rewritten back")
}

// TestParseUsageOracle compares parseUsage with encoding/json on
// response bodies.
func TestParseUsageOracle(t *testing.T) {
	for obj, want := range map[string]usage{
		`{"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`:                                   {prompt: 5, completion: 7},
		`{"id":"x","choices":[{"usage":{"prompt_tokens":99}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`: {prompt: 1, completion: 2},
		`{"usage":{"prompt_tokens":1e1,"completion_tokens":2.0}}`:                                                 {prompt: 10, completion: 2},
		`{"usage":{"prompt_tokens":5,"prompt_tokens":6}}`:                                                         {prompt: 6},
		`{"us\u0061ge":{"prompt_tokens":3}}`:                                                                      {prompt: 3},
		`{"usage":{"prompt_tokens":4,"prompt_tokens_details":{"cached_tokens":3},"completion_tokens":1}}`:         {prompt: 4, cached: 3, completion: 1},
		`{"usage":{"input_tokens":4,"input_tokens_details":{"cached_tokens":null},"output_tokens":1}}`:            {prompt: 4, completion: 1},
	} {
		u, ok := parseUsage([]byte(obj))
		assert.True(t, ok, obj)
		assert.Equal(t, want, u, obj)
	}
	for _, obj := range []string{`{}`, `{"usage":null}`, `{"usage":"x"}`, `not json`, `{"response":null}`, `{"response":{"usage":null}}`} {
		_, ok := parseUsage([]byte(obj))
		assert.False(t, ok, obj)
	}
}

// oracleGen generates valid OpenAI-like request bodies with random key order,
// whitespace, escapes (\u, surrogate pairs, \/ ...), duplicate keys and
// unknown fields.
type oracleGen struct{ r *rand.Rand }

var oracleRunes = []rune("abcxyzMODEL0129-_/.: \"\\'{}[],\u00e9\u4e16\u2028\U0001F600\n\t\x01\x1f\x7f")

func (g *oracleGen) ws(b *bytes.Buffer) {
	if g.r.IntN(4) == 0 {
		b.WriteString([]string{" ", "\n", "\t", "\r\n  ", "  "}[g.r.IntN(5)])
	}
}

// str writes s as a JSON string, escaping characters at random.
func (g *oracleGen) str(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		esc := g.r.IntN(5) == 0
		switch {
		case r == '"' || r == '\\':
			if esc {
				fmt.Fprintf(b, "\\u%04x", r)
			} else {
				b.WriteByte('\\')
				b.WriteRune(r)
			}
		case r < 0x20:
			if short := map[rune]string{'\n': `\n`, '\t': `\t`, '\b': `\b`, '\f': `\f`, '\r': `\r`}[r]; short != "" && !esc {
				b.WriteString(short)
			} else {
				fmt.Fprintf(b, "\\u%04X", r)
			}
		case r == '/' && esc:
			b.WriteString(`\/`)
		case esc && r > 0xffff:
			r1, r2 := oracleSurrogates(r)
			fmt.Fprintf(b, "\\u%04x\\u%04X", r1, r2)
		case esc:
			fmt.Fprintf(b, "\\u%04x", r)
		default:
			b.WriteRune(r)
		}
	}
	if g.r.IntN(30) == 0 {
		b.WriteString(`\ud800`) // a lone surrogate: U+FFFD to encoding/json
	}
	b.WriteByte('"')
}

func oracleSurrogates(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}

func (g *oracleGen) text() string {
	n := g.r.IntN(12)
	rs := make([]rune, n)
	for i := range rs {
		rs[i] = oracleRunes[g.r.IntN(len(oracleRunes))]
	}
	return string(rs)
}

func (g *oracleGen) number(b *bytes.Buffer) {
	b.WriteString([]string{"0", "-0", "1", "42", "-7", "1.5", "1e5", "1E-3", "-0.0", "2.5e+10", "123456789012345678901234567890", "1e999"}[g.r.IntN(12)])
}

func (g *oracleGen) value(b *bytes.Buffer, depth int) {
	k := g.r.IntN(8)
	if depth > 4 {
		k %= 4
	}
	switch k {
	case 0:
		g.str(b, g.text())
	case 1:
		g.number(b)
	case 2:
		b.WriteString([]string{"true", "false", "null"}[g.r.IntN(3)])
	case 3, 4, 5:
		b.WriteByte('[')
		for i := range g.r.IntN(4) {
			if i > 0 {
				b.WriteByte(',')
			}
			g.ws(b)
			g.value(b, depth+1)
			g.ws(b)
		}
		b.WriteByte(']')
	default:
		b.WriteByte('{')
		for i := range g.r.IntN(4) {
			if i > 0 {
				b.WriteByte(',')
			}
			g.ws(b)
			g.str(b, []string{"role", "content", "type", "text", "model", g.text()}[g.r.IntN(6)])
			g.ws(b)
			b.WriteByte(':')
			g.ws(b)
			g.value(b, depth+1)
		}
		b.WriteByte('}')
	}
}

func (g *oracleGen) message(b *bytes.Buffer) {
	b.WriteByte('{')
	fields := []func(){
		func() {
			g.str(b, "role")
			b.WriteByte(':')
			g.str(b, []string{"user", "system", "assistant", "tool"}[g.r.IntN(4)])
		},
		func() {
			g.str(b, "content")
			b.WriteByte(':')
			switch g.r.IntN(3) {
			case 0:
				g.str(b, g.text())
			case 1:
				b.WriteString(`[{"type":"text","text":`)
				g.str(b, g.text())
				b.WriteString(`},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]`)
			default:
				b.WriteString("null")
			}
		},
		func() { g.str(b, "name"); b.WriteByte(':'); g.str(b, g.text()) },
		func() {
			g.str(b, "tool_calls")
			b.WriteString(`:[{"id":"c1","type":"function","function":{"name":"f","arguments":`)
			g.str(b, `{"a":1}`)
			b.WriteString(`}}]`)
		},
	}
	g.r.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
	for i, f := range fields[:1+g.r.IntN(len(fields))] {
		if i > 0 {
			b.WriteByte(',')
		}
		g.ws(b)
		f()
		g.ws(b)
	}
	b.WriteByte('}')
}

func (g *oracleGen) body() []byte {
	var b bytes.Buffer
	g.ws(&b)
	b.WriteByte('{')
	type member struct {
		key string
		val func()
	}
	models := []string{"m", "meta-llama/Llama-3.1-8B-Instruct", "sql-lora", `a"b`, `c\d`, "\u00e9t\u00e9", "\U0001F600", ""}
	all := []member{
		{"model", func() { g.str(&b, models[g.r.IntN(len(models))]) }},
		{"stream", func() { b.WriteString([]string{"true", "false", "null"}[g.r.IntN(3)]) }},
		{"user", func() { g.str(&b, g.text()) }},
		{"max_tokens", func() { b.WriteString([]string{"16", "0", "1e2", "null"}[g.r.IntN(4)]) }},
		{"stream_options", func() { b.WriteString(`{"include_usage":` + []string{"true", "false"}[g.r.IntN(2)] + `}`) }},
		{"messages", func() {
			b.WriteByte('[')
			for i := range g.r.IntN(4) {
				if i > 0 {
					b.WriteByte(',')
				}
				g.ws(&b)
				g.message(&b)
			}
			b.WriteByte(']')
		}},
		{"prompt", func() {
			switch g.r.IntN(3) {
			case 0:
				g.str(&b, g.text())
			case 1:
				b.WriteString("[1, 2,3]")
			default:
				b.WriteString(`["a","b"]`)
			}
		}},
		{"input", func() { g.str(&b, g.text()) }},
		{"tools", func() { g.value(&b, 2) }},
		{"temperature", func() { g.number(&b) }},
		{"metadata", func() { g.value(&b, 0) }},
		{"Model", func() { g.str(&b, "shadow") }},
	}
	n := g.r.IntN(7)
	for i := range n {
		m := all[g.r.IntN(len(all))]
		if i > 0 {
			b.WriteByte(',')
		}
		g.ws(&b)
		g.str(&b, m.key)
		g.ws(&b)
		b.WriteByte(':')
		g.ws(&b)
		m.val()
		g.ws(&b)
	}
	b.WriteByte('}')
	g.ws(&b)
	return b.Bytes()
}

// mutate applies a few rune-level edits with JSON-significant ASCII, so that
// the body stays valid UTF-8 without raw control characters (those are
// covered by TestParseModelCheckedAsEncodingJSON).
func (g *oracleGen) mutate(body []byte) []byte {
	rs := []rune(string(body))
	alphabet := []rune(`{}[]:,"\ 0123456789.-+eEtrufalsnu/x`)
	for range 1 + g.r.IntN(3) {
		if len(rs) == 0 {
			break
		}
		i := g.r.IntN(len(rs))
		switch g.r.IntN(6) {
		case 0:
			rs = append(rs[:i:i], rs[i+1:]...)
		case 1:
			rs = append(rs[:i:i], append([]rune{alphabet[g.r.IntN(len(alphabet))]}, rs[i:]...)...)
		case 2:
			rs[i] = alphabet[g.r.IntN(len(alphabet))]
		case 3:
			rs = rs[:i]
		case 4: // duplicate a span
			j := i + g.r.IntN(len(rs)-i)
			rs = append(rs[:j:j], append(append([]rune{}, rs[i:j]...), rs[j:]...)...)
		default: // swap two runes
			j := g.r.IntN(len(rs))
			rs[i], rs[j] = rs[j], rs[i]
		}
	}
	return []byte(string(rs))
}

// someWrongType reports whether some top-level occurrence of key in the
// JSON object body does not decode into the type ParseRequest reads it as.
func someWrongType(body []byte, key string) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil {
		return false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			return false
		}
		if tok.(string) != key {
			continue
		}
		switch key {
		case "model":
			var s string
			if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
				return true
			}
		case "stream":
			var b *bool
			if json.Unmarshal(raw, &b) != nil {
				return true
			}
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			var f *float64
			if json.Unmarshal(raw, &f) != nil || f != nil && (*f < 0 || *f != float64(int(*f))) {
				return true
			}
		}
	}
	return false
}

// TestParseOracleProperty: generated valid bodies and mutations of
// them, checked against encoding/json. For every input: no panic;
// ParseRequestPrompt fails whenever ParseRequest does and otherwise agrees
// with it; a valid JSON object parses (or fails only on a known field
// encoding/json cannot decode into its Go type) to encoding/json's model,
// stream and user; an invalid body is accepted only when the invalidity is
// in the contents of strings or numbers it skips (the documented
// deviation: structureOf), never in the model; RewriteModel keeps every
// other field.
func TestParseOracleProperty(t *testing.T) {
	g := &oracleGen{r: rand.New(rand.NewPCG(20240611, 7))}
	h := prefix.NewHasher(prefix.HashConfig{BlockBytes: 16})
	pr := h.NewPrompt()
	var valid, invalid, accepted, rejected int
	for n := range 4000 {
		body := g.body()
		if n%4 != 0 {
			body = g.mutate(body)
		}
		fail := func(format string, args ...any) {
			t.Helper()
			t.Errorf("body %q: "+format, append([]any{body}, args...)...)
		}
		p, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
		p2, err2 := ParseRequestPrompt("/v1/chat/completions", nil, body, ParseOptions{}, pr)
		if err != nil && !errors.Is(err, ErrMalformed) {
			fail("error %v does not wrap ErrMalformed", err)
		}
		if err != nil && err2 == nil {
			fail("ParseRequest fails (%v), ParseRequestPrompt does not", err)
		}
		if err == nil && err2 == nil && (p.Model != p2.Model || p.Stream != p2.Stream || p.SessionKey != p2.SessionKey ||
			p.MaxOutputTokens != p2.MaxOutputTokens || p.IncludeUsage != p2.IncludeUsage || p.HasModel() != p2.HasModel()) {
			fail("ParseRequest %+v, ParseRequestPrompt %+v", p, p2)
		}
		if err == nil {
			accepted++
			var req signals.Request
			_ = Prepare(&req, &p, Route{Model: "m"}, body, nil, h, nil) // must not panic
		} else {
			rejected++
		}
		ref := jsonRef(body)
		if !p.JSON {
			if ref.object {
				fail("a JSON object read as not JSON")
			}
			continue
		}
		if !ref.object {
			invalid++
			if err == nil {
				if !json.Valid(structureOf(body)) {
					fail("malformed JSON accepted (model %q)", p.Model)
				} else if p.HasModel() && !json.Valid(body[p.modelStart:p.modelEnd]) {
					fail("malformed model value %q accepted as %q", body[p.modelStart:p.modelEnd], p.Model)
				}
			}
			continue
		}
		valid++
		if err != nil {
			var fe *fieldError
			if !errors.As(err, &fe) {
				fail("valid JSON object rejected: %v", err)
			} else if !someWrongType(body, fe.field) {
				// A field error is fine when some occurrence of the key
				// (not necessarily the last, which encoding/json keeps)
				// has the wrong type: a request the router refuses.
				fail("%s rejected, but every occurrence decodes: %v", fe.field, err)
			}
			continue
		}
		if ref.modelStr != p.HasModel() || ref.model != p.Model {
			fail("model %q (has %v), encoding/json %q (has %v)", p.Model, p.HasModel(), ref.model, ref.modelStr)
		}
		if ref.streamOK && ref.stream != p.Stream {
			fail("stream %v, encoding/json %v", p.Stream, ref.stream)
		}
		if ref.user != p.SessionKey {
			fail("session key %q, encoding/json user %q", p.SessionKey, ref.user)
		}
		if p.HasModel() {
			const to = "served/\"x\"\\\u00e9\n"
			out := p.RewriteModel(body, to)
			var a, b map[string]json.RawMessage
			if json.Unmarshal(body, &a) != nil || json.Unmarshal(out, &b) != nil {
				fail("rewritten body %q is not a JSON object", out)
				continue
			}
			var m string
			if json.Unmarshal(b["model"], &m) != nil || m != to {
				fail("rewritten model %s", b["model"])
			}
			delete(a, "model")
			delete(b, "model")
			if !assert.Equal(t, a, b, "rewrite changed other fields: %q -> %q", body, out) {
				continue
			}
		}
	}
	t.Logf("%d valid objects, %d invalid bodies; %d accepted, %d rejected", valid, invalid, accepted, rejected)
	assert.Greater(t, valid, 1000)
	assert.Greater(t, invalid, 1000)
}

// TestParseKeyOrderIndependent: HashBody renders each message as
// role, name, content, tool calls and tool_call_id "in that order whatever
// the key order of the body", and tools/instructions before the messages
// wherever they appear. Shuffling the keys of the messages and of the
// top-level object must not change the blocks or the token estimate, in
// either entry point.
func TestParseKeyOrderIndependent(t *testing.T) {
	r := rand.New(rand.NewPCG(99, 1))
	h := prefix.NewHasher(prefix.HashConfig{BlockBytes: 8})
	pr := h.NewPrompt()
	type kv struct{ k, v string }
	obj := func(members []kv) string {
		r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
		var b strings.Builder
		b.WriteByte('{')
		for i, m := range members {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"` + m.k + `":` + m.v)
		}
		b.WriteByte('}')
		return b.String()
	}
	contents := []string{`"plain text content"`, `"esc\u00e9\"q\\ \n"`, `[{"type":"text","text":"part one"},{"type":"image_url","image_url":{"url":"u"}},"bare string part"]`, `null`, `[]`, `""`}
	for n := range 300 {
		var msgs [][]kv
		for range 1 + r.IntN(4) {
			var m []kv
			if r.IntN(5) > 0 {
				m = append(m, kv{"role", []string{`"user"`, `"system"`, `"assistant"`, `"tool"`}[r.IntN(4)]})
			}
			if r.IntN(3) == 0 {
				m = append(m, kv{"name", `"nm` + fmt.Sprint(r.IntN(3)) + `"`})
			}
			if r.IntN(5) > 0 || len(m) == 0 || m[0].k != "role" {
				// An item with neither role nor content renders as its raw
				// JSON, key order included, by design.
				m = append(m, kv{"content", contents[r.IntN(len(contents))]})
			}
			if r.IntN(4) == 0 {
				m = append(m, kv{"tool_calls", `[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]`})
			}
			if r.IntN(4) == 0 {
				m = append(m, kv{"tool_call_id", `"call_1"`})
			}
			if r.IntN(4) == 0 {
				m = append(m, kv{"extra", `{"role":"ignored","content":"ignored"}`})
			}
			msgs = append(msgs, m)
		}
		top := []kv{{"model", `"m"`}, {"stream", `true`}}
		if r.IntN(2) == 0 {
			top = append(top, kv{"tools", `[{"type":"function","function":{"name":"f"}}]`})
		}
		path := "/v1/chat/completions"
		key := "messages"
		if n%3 == 0 {
			path, key = "/v1/responses", "input"
			if r.IntN(2) == 0 {
				top = append(top, kv{"instructions", `"be brief and helpful"`})
			}
		}
		render := func() string {
			items := make([]string, len(msgs))
			for i, m := range msgs {
				items[i] = obj(append([]kv(nil), m...))
			}
			return obj(append(append([]kv(nil), top...), kv{key, "[" + strings.Join(items, ",") + "]"}))
		}
		first := []byte(render())
		want, wantN, err := h.HashBody(nil, "m", "", first)
		require.NoError(t, err, "%s", first)
		for range 6 {
			body := []byte(render())
			got, gotN, err := h.HashBody(nil, "m", "", body)
			require.NoError(t, err, "%s", body)
			if !assert.Equal(t, want, got, "blocks differ:\n%s\n%s", first, body) || !assert.Equal(t, wantN, gotN, "bytes differ:\n%s\n%s", first, body) {
				return
			}
			p, err := ParseRequestPrompt(path, nil, body, ParseOptions{}, pr)
			require.NoError(t, err)
			var req signals.Request
			require.NoError(t, Prepare(&req, &p, Route{Model: "m"}, body, nil, h, nil))
			if !assert.Equal(t, want, req.PromptBlocks, "one-pass blocks differ:\n%s\n%s", first, body) {
				return
			}
			assert.Equal(t, wantN/prefix.BytesPerToken, req.PromptTokens)
		}
	}
}

// TestParseTableAdapterWithoutBase: NewTable rejects an empty model
// name, and so an adapter whose base model is "" (it would route with
// signals.Request.Model "" and list "parent":"") or one outside the pool's
// models (routed to a pool that does not serve its base).
func TestParseTableAdapterWithoutBase(t *testing.T) {
	_, err := NewTable(TableConfig{Pools: []PoolConfig{{Name: "p", Picker: newTestPicker(t), Models: []string{"m"},
		Adapters: map[string]string{"lora": ""}}}})
	assert.ErrorContains(t, err, `adapter "lora" has no base model`)
	_, err = NewTable(TableConfig{Pools: []PoolConfig{{Name: "p", Picker: newTestPicker(t), Models: []string{"m"},
		Adapters: map[string]string{"lora": "other"}}}})
	assert.ErrorContains(t, err, `adapter "lora" has base model "other", which is not a model of the pool`)
	_, err = NewTable(TableConfig{Pools: []PoolConfig{{Name: "p", Picker: newTestPicker(t),
		Adapters: map[string]string{"lora": "any"}}}})
	assert.NoError(t, err, "a pool that lists no models takes an adapter of any base")
}
