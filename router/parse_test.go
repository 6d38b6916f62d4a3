package router

import (
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// fixtures is shared/fixtures/openai, beside the checkout.
const fixtures = "../../shared/fixtures/openai"

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtures, name))
	require.NoError(t, err)
	return b
}

// parsers are the two ways to parse a request: ParseRequest, and
// ParseRequestPrompt, which also renders the prompt; every field they
// return must agree.
var parsers = []struct {
	name  string
	parse func(path string, header http.Header, body []byte, opts ParseOptions) (Parsed, error)
}{
	{"ParseRequest", ParseRequest},
	{"ParseRequestPrompt", func(path string, header http.Header, body []byte, opts ParseOptions) (Parsed, error) {
		return ParseRequestPrompt(path, header, body, opts, prefix.NewHasher(prefix.HashConfig{}).NewPrompt())
	}},
}

func TestParseRequestFixtures(t *testing.T) {
	tests := []struct {
		name, path, file string
		want             Parsed
	}{
		{"chat", "/v1/chat/completions", "openai-api/chat-completions.request.json",
			Parsed{Kind: KindChat, JSON: true, Model: "gpt-5-nano"}},
		{"chat stream with usage", "/v1/chat/completions", "openai-api/chat-completions-stream-include-usage.request.json",
			Parsed{Kind: KindChat, JSON: true, Model: "gpt-5-nano", Stream: true, IncludeUsage: true, MaxOutputTokens: 100}},
		{"completions token ids", "/v1/completions", "openai-api/completions-prompt-token-array.request.json",
			Parsed{Kind: KindCompletions, JSON: true, Model: "babbage-002", MaxOutputTokens: 25}},
		{"embeddings batch", "/v1/embeddings", "openai-api/embeddings-string-array.request.json",
			Parsed{Kind: KindEmbeddings, JSON: true, Model: "text-embedding-3-small"}},
		{"responses", "/v1/responses", "llm-d-inference-sim/responses.request.json",
			Parsed{Kind: KindResponses, JSON: true, Model: "meta-llama/Llama-3.1-8B-Instruct"}},
		{"lora", "/v1/chat/completions", "llm-d-inference-sim/chat-completions-lora.request.json",
			Parsed{Kind: KindChat, JSON: true, Model: "chat-lora", MaxOutputTokens: 20}},
	}
	for _, ps := range parsers {
		for _, tc := range tests {
			t.Run(ps.name+"/"+tc.name, func(t *testing.T) {
				got, err := ps.parse(tc.path, nil, fixture(t, tc.file), ParseOptions{})
				require.NoError(t, err)
				got.modelStart, got.modelEnd, got.prompt = 0, 0, nil
				assert.Equal(t, tc.want, got)
			})
		}
	}
}

func TestParseRequestFields(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		header http.Header
		want   Parsed
	}{
		{"empty body is not JSON", "", nil, Parsed{Kind: KindChat}},
		{"text body is not JSON", "hello", nil, Parsed{Kind: KindChat}},
		{"no model", `{"messages":[]}`, nil, Parsed{Kind: KindChat, JSON: true}},
		{"escaped model", `{"model":"a\"b\u00e9"}`, nil, Parsed{Kind: KindChat, JSON: true, Model: `a"bé`}},
		{"escaped quote before key", `{"x":"\\","model":"m"}`, nil, Parsed{Kind: KindChat, JSON: true, Model: "m"}},
		{"stream false", `{"model":"m","stream":false}`, nil, Parsed{Kind: KindChat, JSON: true, Model: "m"}},
		{"max_completion_tokens wins", `{"max_completion_tokens":7,"max_tokens":9}`, nil,
			Parsed{Kind: KindChat, JSON: true, MaxOutputTokens: 7}},
		{"max_tokens after max_completion_tokens", `{"max_tokens":9,"max_completion_tokens":7}`, nil,
			Parsed{Kind: KindChat, JSON: true, MaxOutputTokens: 7}},
		{"null max_tokens", `{"max_tokens":null}`, nil, Parsed{Kind: KindChat, JSON: true}},
		{"user is the session", `{"user":"u1","safety_identifier":"s1"}`, nil,
			Parsed{Kind: KindChat, JSON: true, SessionKey: "u1"}},
		{"prompt_cache_key before user", `{"user":"u1","prompt_cache_key":"k1"}`, nil,
			Parsed{Kind: KindChat, JSON: true, SessionKey: "k1"}},
		{"headers", `{"user":"u1"}`, http.Header{
			"X-Session-Id": {"h1"}, "X-Inferroute-Priority": {"-2"}, "X-Request-Id": {"r1"},
			"X-Slo-Ttft-Ms": {"250"}, "X-Slo-Tpot-Ms": {"20"},
		}, Parsed{Kind: KindChat, JSON: true, SessionKey: "h1", Priority: -2, RequestID: "r1",
			SLO: signals.SLO{TTFT: 250 * time.Millisecond, TPOT: 20 * time.Millisecond}}},
		{"whitespace around", " \n{ \"model\" : \"m\" , \"stream\" : true }\n", nil,
			Parsed{Kind: KindChat, JSON: true, Model: "m", Stream: true}},
	}
	for _, ps := range parsers {
		for _, tc := range tests {
			t.Run(ps.name+"/"+tc.name, func(t *testing.T) {
				got, err := ps.parse("/v1/chat/completions", tc.header, []byte(tc.body), ParseOptions{})
				require.NoError(t, err)
				got.modelStart, got.modelEnd, got.prompt = 0, 0, nil
				assert.Equal(t, tc.want, got)
			})
		}
	}
}

// TestParseHeadersDoNotAllocate checks that reading the routing headers
// costs no allocation: http.Header.Get with a lowercase name allocates its
// canonical copy on every call, so the names are canonicalized once (the
// defaults at init, configured ones by NewProxy), and the values read are
// the same as with the names as configured.
func TestParseHeadersDoNotAllocate(t *testing.T) {
	h := http.Header{
		"X-Session-Id": {"h1"}, "X-Inferroute-Priority": {"3"}, "X-Request-Id": {"r1"},
		"X-Slo-Ttft-Ms": {"250"}, "X-Slo-Tpot-Ms": {"20"}, "X-My-Session": {"mine"}, "X-My-Priority": {"-1"},
	}
	var p Parsed
	allocs := testing.AllocsPerRun(100, func() {
		if err := p.headers(h, ParseOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "allocations per call with the default header names")
	assert.Equal(t, "h1", p.SessionKey)
	assert.Equal(t, 3, p.Priority)

	lower := ParseOptions{SessionHeader: "x-my-session", PriorityHeader: "x-my-priority"}
	opts := lower.Canonical()
	allocs = testing.AllocsPerRun(100, func() {
		if err := p.headers(h, opts); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "allocations per call with canonicalized configured names")
	var q Parsed
	require.NoError(t, q.headers(h, lower))
	assert.Equal(t, q, p, "canonical names read what the names as configured read")
	assert.Equal(t, "mine", p.SessionKey)
	assert.Equal(t, -1, p.Priority)

	_, err := ParseRequest("/v1/chat/completions", http.Header{"X-Inferroute-Priority": {"high"}}, nil, ParseOptions{})
	require.ErrorIs(t, err, ErrMalformed)
	assert.Contains(t, err.Error(), "header x-inferroute-priority:", "errors name the header as documented")
}

// TestParseRequestEscapedKeys: a key is read as a model server's JSON
// reader reads it, escapes decoded, so that a client cannot route by one
// model and be served another ("mod\u0065l" after "model" is, to vLLM's
// reader, the model).
func TestParseRequestEscapedKeys(t *testing.T) {
	body := []byte(`{"model":"cheap","str\u0065am":true,"mod\u0065l":"expensive","us\u0065r":"u-1",` +
		`"messages":[{"r\u006fle":"user","c\u006fntent":"hi"}]}`)
	for _, ps := range parsers {
		t.Run(ps.name, func(t *testing.T) {
			p, err := ps.parse("/v1/chat/completions", nil, body, ParseOptions{})
			require.NoError(t, err)
			assert.Equal(t, "expensive", p.Model)
			assert.True(t, p.Stream)
			assert.Equal(t, "u-1", p.SessionKey)
			out := p.RewriteModel(body, "served")
			q, err := ps.parse("/v1/chat/completions", nil, out, ParseOptions{})
			require.NoError(t, err)
			assert.Equal(t, "served", q.Model)
			assert.Contains(t, string(out), `"model":"cheap"`, "the earlier, shadowed key is left alone")
		})
	}
}

func TestParseRequestErrors(t *testing.T) {
	tests := []struct {
		name, body string
		header     http.Header
		param      string
	}{
		{"truncated", `{"model":"m","messages":[`, nil, ""},
		{"unterminated string", `{"model":"m`, nil, ""},
		{"trailing data", `{"model":"m"} {}`, nil, ""},
		{"missing colon", `{"model" "m"}`, nil, ""},
		{"bad literal", `{"stream":tru}`, nil, ""},
		{"model not a string", `{"model":42}`, nil, "model"},
		{"stream not a bool", `{"stream":"yes"}`, nil, "stream"},
		{"negative max_tokens", `{"max_tokens":-1}`, nil, "max_tokens"},
		{"fractional max_tokens", `{"max_tokens":1.5}`, nil, "max_tokens"},
		{"deep nesting", `{"x":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `}`, nil, ""},
		{"bad priority", `{}`, http.Header{"X-Inferroute-Priority": {"high"}}, ""},
		{"bad SLO", `{}`, http.Header{"X-Slo-Ttft-Ms": {"-5"}}, ""},
		{"bad escape in a key", `{"mo\del":"m"}`, nil, ""},
	}
	for _, ps := range parsers {
		for _, tc := range tests {
			t.Run(ps.name+"/"+tc.name, func(t *testing.T) {
				_, err := ps.parse("/v1/chat/completions", tc.header, []byte(tc.body), ParseOptions{})
				require.ErrorIs(t, err, ErrMalformed)
				assert.Equal(t, tc.param, param(err))
				assert.Equal(t, 400, errorFor(err, 0).Status)
			})
		}
	}
}

// TestParseSyntaxErrorMessage checks what a client reads for a body that
// is not JSON: the byte where reading stopped (the end of a body truncated
// between values, the opening quote of an unterminated string, or the
// first byte that cannot continue it), under ErrMalformed and
// prefix.ErrBadBody, without the name of the package that found it.
func TestParseSyntaxErrorMessage(t *testing.T) {
	valid := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	tests := []struct {
		name string
		body string
		at   int
	}{
		{"truncated in an array", valid[:len(`{"model":"m","messages":[`)], len(`{"model":"m","messages":[`)},
		{"truncated in a string", valid[:len(`{"model":"m","messages":[{"role":"us`)], len(`{"model":"m","messages":[{"role":`)},
		{"a stray byte", `{"model":"m",@"messages":[]}`, strings.IndexByte(`{"model":"m",@"messages":[]}`, '@')},
		{"a stray byte in a message", `{"messages":[{"role":"user"#}]}`, strings.IndexByte(`{"messages":[{"role":"user"#}]}`, '#')},
	}
	for _, ps := range parsers {
		for _, tc := range tests {
			t.Run(ps.name+"/"+tc.name, func(t *testing.T) {
				_, err := ps.parse("/v1/chat/completions", nil, []byte(tc.body), ParseOptions{})
				require.ErrorIs(t, err, ErrMalformed)
				require.ErrorIs(t, err, prefix.ErrBadBody)
				var se *prefix.SyntaxError
				require.ErrorAs(t, err, &se)
				assert.Equal(t, tc.at, se.Offset, "offset in %q", tc.body)
				e := errorFor(err, 0)
				assert.Equal(t, 400, e.Status)
				assert.Equal(t, fmt.Sprintf("malformed request: malformed JSON at byte %d", tc.at), e.Message)
			})
		}
	}
}

func TestKindOf(t *testing.T) {
	tests := map[string]Kind{
		"/v1/chat/completions":  KindChat,
		"/v1/chat/completions/": KindChat,
		"/v1/completions":       KindCompletions,
		"/v1/embeddings":        KindEmbeddings,
		"/v1/responses":         KindResponses,
		"/v1/models":            KindModels,
		"/health":               KindOther,
		"/chat/completions":     KindOther,
	}
	for path, want := range tests {
		t.Run(path, func(t *testing.T) {
			assert.Equal(t, want, KindOf(path))
		})
	}
}

func TestRewriteModel(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"hi \"model\""}],"model":"alias","stream":true}`)
	p, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
	require.NoError(t, err)
	got := p.RewriteModel(body, `served/"x"`)
	assert.Equal(t, `{"messages":[{"role":"user","content":"hi \"model\""}],"model":"served/\"x\"","stream":true}`, string(got))
	assert.Equal(t, `{"messages":[{"role":"user","content":"hi \"model\""}],"model":"alias","stream":true}`, string(body),
		"the original body is untouched")
	assert.Same(t, &body[0], &p.RewriteModel(body, "alias")[0], "no rewrite to the same name")
}

func TestPrepare(t *testing.T) {
	h := prefix.NewHasher(prefix.HashConfig{})
	text := strings.Repeat("0123456789abcdef", 16) // 256 bytes: 4 blocks of 64, 64 tokens at chars/4
	tests := []struct {
		name       string
		body       string
		rt         Route
		wantTokens int
		wantBlocks []uint64
	}{
		{"prompt string", `{"model":"m","prompt":"` + text + `"}`, Route{Model: "m"}, 64,
			h.HashText(nil, "m", "", []byte(text))},
		{"adapter seeds the hashes", `{"model":"sql","prompt":"` + text + `"}`, Route{Model: "base", Adapter: "sql"}, 64,
			h.HashText(nil, "base", "sql", []byte(text))},
		{"token ids count exactly", string(fixture(t, "openai-api/completions-prompt-token-array.request.json")),
			Route{Model: "babbage-002"}, 31, nil},
		{"no prompt", `{"model":"m"}`, Route{Model: "m"}, 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			hdr := http.Header{"X-Slo-Ttft-Ms": {"100"}}
			p, err := ParseRequestPrompt("/v1/completions", hdr, body, ParseOptions{}, h.NewPrompt())
			require.NoError(t, err)
			var req signals.Request
			require.NoError(t, Prepare(&req, &p, tc.rt, body, hdr, h, nil))
			assert.Equal(t, tc.rt.Model, req.Model)
			assert.Equal(t, tc.rt.Adapter, req.Adapter)
			assert.Equal(t, tc.wantTokens, req.PromptTokens)
			assert.Equal(t, 100*time.Millisecond, req.SLO.TTFT)
			if tc.wantBlocks != nil {
				assert.Equal(t, tc.wantBlocks, req.PromptBlocks)
			}
			if tc.name == "token ids count exactly" {
				assert.Len(t, req.PromptBlocks, 1, "31 ids make one full block of 16")
			}
		})
	}
}

// TestPrepareOnePassMatchesTwoPasses checks that the prompt rendered by
// ParseRequestPrompt hashes to the blocks Prepare computes from the body
// after ParseRequest, on every fixture body and on long bodies.
func TestPrepareOnePassMatchesTwoPasses(t *testing.T) {
	bodies := map[string][]byte{}
	err := filepath.WalkDir(fixtures, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".request.json") {
			return err
		}
		bodies[filepath.Base(path)], err = os.ReadFile(path)
		return err
	})
	require.NoError(t, err)
	require.Greater(t, len(bodies), 20)
	for _, sz := range benchSizes {
		bodies[sz.name] = chatBody(sz.size)
	}
	bodies["content before role"] = []byte(`{"messages":[{"content":"` + strings.Repeat(`a long \"system\" prompt\n`, 40) +
		`","role":"system"},{"content":"hi","name":"n","role":"user"}],"model":"m"}`)
	h := prefix.NewHasher(prefix.HashConfig{BlockBytes: 32})
	pr := h.NewPrompt()
	rt := Route{Model: "base", Adapter: "lora"}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			p2, err2 := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
			p1, err1 := ParseRequestPrompt("/v1/chat/completions", nil, body, ParseOptions{}, pr)
			if err2 != nil {
				require.ErrorIs(t, err1, ErrMalformed)
				return
			}
			var r1, r2 signals.Request
			err2 = Prepare(&r2, &p2, rt, body, nil, h, nil)
			if err2 != nil {
				require.ErrorIs(t, err1, ErrMalformed, "a prompt of the wrong shape fails the one-pass parse")
				return
			}
			require.NoError(t, err1)
			require.NoError(t, Prepare(&r1, &p1, rt, body, nil, h, nil))
			assert.Equal(t, r2.PromptTokens, r1.PromptTokens)
			assert.Equal(t, r2.PromptBlocks, r1.PromptBlocks)
			want, n, err := h.HashBody(nil, "base", "lora", body)
			require.NoError(t, err)
			assert.Equal(t, want, r1.PromptBlocks)
			assert.Equal(t, n/prefix.BytesPerToken, r1.PromptTokens)
		})
	}
}

func TestParseRequestPromptShapeAndHasher(t *testing.T) {
	h := prefix.NewHasher(prefix.HashConfig{})
	body := []byte(`{"model":"m","messages":"not an array"}`)
	_, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
	require.NoError(t, err, "ParseRequest leaves the prompt to Prepare")
	_, err = ParseRequestPrompt("/v1/chat/completions", nil, body, ParseOptions{}, h.NewPrompt())
	require.ErrorIs(t, err, ErrMalformed)
	assert.Equal(t, 400, errorFor(err, 0).Status)

	// A Prompt of another Hasher is not used: Prepare reads the body with
	// the Hasher it is given.
	body = []byte(`{"model":"m","prompt":"` + strings.Repeat("0123456789abcdef", 8) + `"}`)
	p, err := ParseRequestPrompt("/v1/completions", nil, body, ParseOptions{}, h.NewPrompt())
	require.NoError(t, err)
	h16 := prefix.NewHasher(prefix.HashConfig{BlockBytes: 16})
	var req signals.Request
	require.NoError(t, Prepare(&req, &p, Route{Model: "m"}, body, nil, h16, nil))
	want, _, err := h16.HashBody(nil, "m", "", body)
	require.NoError(t, err)
	assert.Len(t, req.PromptBlocks, 8)
	assert.Equal(t, want, req.PromptBlocks)
}

func TestParseUsage(t *testing.T) {
	lastChunk := func(file string) []byte {
		var last []byte
		for _, line := range strings.Split(string(fixture(t, file)), "\n") {
			if p, ok := sseData([]byte(line)); ok && strings.Contains(string(p), `"usage":{`) {
				last = p
			}
		}
		return last
	}
	tests := []struct {
		name string
		obj  []byte
		want usage
		ok   bool
	}{
		{"chat response", fixture(t, "openai-api/chat-completions.response.json"), usage{prompt: 8, completion: 377}, true},
		{"responses API", fixture(t, "llm-d-inference-sim/responses.response.json"), usage{prompt: 7, completion: 53}, true},
		{"SSE last chunk", lastChunk("llm-d-inference-sim/chat-completions-lora-stream.response.sse"), usage{prompt: 26, completion: 7}, true},
		{"OpenAI SSE last chunk", lastChunk("openai-api/chat-completions-stream-include-usage.response.sse"), usage{prompt: 12, completion: 100}, true},
		{"cached tokens", []byte(`{"usage":{"prompt_tokens":100,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":64}}}`),
			usage{prompt: 100, cached: 64, completion: 3}, true},
		{"responses stream completed event", []byte(`{"type":"response.completed","response":{"usage":{"input_tokens":5,"output_tokens":2,"input_tokens_details":{"cached_tokens":1}}}}`),
			usage{prompt: 5, cached: 1, completion: 2}, true},
		{"null usage", []byte(`{"usage":null,"choices":[]}`), usage{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.NotEmpty(t, tc.obj)
			got, ok := parseUsage(tc.obj)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestRewriteModelField(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"chunk", `{"id":"c","model":"served","choices":[{"delta":{"content":"model"}}]}`,
			`{"id":"c","model":"alias","choices":[{"delta":{"content":"model"}}]}`},
		{"responses stream event", `{"type":"response.completed","response":{"id":"r","model":"served"}}`,
			`{"type":"response.completed","response":{"id":"r","model":"alias"}}`},
		{"top-level model first", `{"model":"served","response":{"model":"served"}}`, `{"model":"alias","response":{"model":"served"}}`},
		{"other nested model untouched", `{"item":{"model":"served"}}`, `{"item":{"model":"served"}}`},
		{"no model", `{"id":"c"}`, `{"id":"c"}`},
		{"not JSON", `[DONE]`, `[DONE]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, string(rewriteModelField([]byte(tc.in), "alias")))
		})
	}
}

// TestUpstreamErrorsHideAddresses checks the messages clients read for
// upstream failures: a network error keeps what happened and loses the
// fleet's addresses.
func TestUpstreamErrorsHideAddresses(t *testing.T) {
	pod := &net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 8000}
	self := &net.TCPAddr{IP: net.ParseIP("10.9.9.9"), Port: 41234}
	reset := &net.OpError{Op: "read", Net: "tcp", Source: self, Addr: pod, Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	refused := &net.OpError{Op: "dial", Net: "tcp", Addr: pod, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	timeout := &net.OpError{Op: "read", Net: "tcp", Source: self, Addr: pod, Err: os.ErrDeadlineExceeded}
	require.Contains(t, reset.Error(), "10.1.2.3", "the raw error names the pod")

	assert.Equal(t, "inferroute router: upstream stream broken: read: connection reset by peer",
		withoutAddresses(fmt.Errorf("inferroute router: %w: %w", ErrStreamBroken, reset)))
	assert.Equal(t, "read: i/o timeout", withoutAddresses(timeout))
	assert.Equal(t, "dial: connect: connection refused", withoutAddresses(refused))
	assert.Equal(t, "unexpected EOF", withoutAddresses(io.ErrUnexpectedEOF), "no network error: unchanged")

	for _, err := range []error{refused, fmt.Errorf("%w: 503 from %s", ErrUpstreamStatus, pod),
		fmt.Errorf("%w: reading the head: %w", ErrUpstreamProtocol, reset)} {
		ae := errorFor(err, 0)
		assert.Equal(t, 502, ae.Status, err)
		assert.NotContains(t, ae.Message, "10.1.2.3", err)
	}
}

func TestAPIErrorJSON(t *testing.T) {
	e := &APIError{Message: "The model `x` does not exist.", Type: "invalid_request_error", Param: "model", Code: "model_not_found"}
	assert.JSONEq(t, `{"error":{"message":"The model `+"`x`"+` does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`,
		string(e.AppendJSON(nil)))
	e = &APIError{Message: "a \"quoted\"\n", Type: "server_error"}
	assert.JSONEq(t, `{"error":{"message":"a \"quoted\"\n","type":"server_error","param":null,"code":null}}`, string(e.AppendJSON(nil)))
}
