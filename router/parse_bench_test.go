package router

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// chatBody returns a chat completions body of about size bytes: a system
// prompt and a long user message of English-like text with escapes, plus
// the usual sampling fields after the messages.
func chatBody(size int) []byte {
	var sb strings.Builder
	sentence := `The quick brown fox jumps over the lazy dog, then says \"hello\" and writes a line of code.\n`
	for sb.Len() < size-200 {
		sb.WriteString(sentence)
	}
	text := sb.String()[:max(size-200, 0)]
	text = strings.TrimRight(text, `\`)
	return fmt.Appendf(nil, `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"%s"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":256,"temperature":0.7,"user":"u-42"}`, text)
}

var benchSizes = []struct {
	name string
	size int
}{{"1KB", 1 << 10}, {"32KB", 32 << 10}, {"220KB", 220 << 10}}

// plainChatBody is the 220 KB body of benchmarks/overhead/run.sh: English
// text without a single escape.
func plainChatBody(size int) []byte {
	s := "The quick brown fox jumps over the lazy dog while the model server keeps its cache warm. "
	text := strings.Repeat(s, size/len(s)+1)[:size-220]
	return fmt.Appendf(nil, `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"%s"}],"max_tokens":64,"temperature":0.7,"user":"bench"}`, text)
}

// prepareBodies are benchSizes' bodies and the plain body of the overhead
// benchmark.
func prepareBodies() []struct {
	name string
	body []byte
} {
	var out []struct {
		name string
		body []byte
	}
	for _, sz := range benchSizes {
		out = append(out, struct {
			name string
			body []byte
		}{sz.name, chatBody(sz.size)})
	}
	return append(out, struct {
		name string
		body []byte
	}{"220KB-plain", plainChatBody(220 << 10)})
}

func BenchmarkParseRequest(b *testing.B) {
	for _, sz := range benchSizes {
		body := chatBody(sz.size)
		b.Run(sz.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				p, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
				if err != nil || p.Model == "" {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPrepare is ParseRequestPrompt plus Prepare, the Proxy's path:
// the whole per-request body cost of the router (parse, render and hash
// the prompt for the prefix index).
func BenchmarkPrepare(b *testing.B) {
	benchPrepare(b, true)
}

// BenchmarkPrepareTwoPass is ParseRequest plus Prepare, which reads the
// body a second time to render the prompt (the path of callers that parse
// without a prefix.Prompt).
func BenchmarkPrepareTwoPass(b *testing.B) {
	benchPrepare(b, false)
}

func benchPrepare(b *testing.B, onePass bool) {
	h := prefix.NewHasher(prefix.HashConfig{})
	rt := Route{Model: "meta-llama/Llama-3.1-8B-Instruct"}
	pr := h.NewPrompt()
	for _, bb := range prepareBodies() {
		body := bb.body
		b.Run(bb.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var req signals.Request
			for b.Loop() {
				var p Parsed
				var err error
				if onePass {
					p, err = ParseRequestPrompt("/v1/chat/completions", nil, body, ParseOptions{}, pr)
				} else {
					p, err = ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
				}
				if err != nil {
					b.Fatal(err)
				}
				if err := Prepare(&req, &p, rt, body, nil, h, req.PromptBlocks); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// cannedTransport answers every request in memory with a canned chat
// completion, so BenchmarkProxy measures the proxy, not a network.
type cannedTransport struct{ body []byte }

func (c cannedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	_ = r.Body.Close() // as http.RoundTripper must
	return &http.Response{
		StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(c.body)),
		ContentLength: int64(len(c.body)), Request: r,
	}, nil
}

// BenchmarkProxy is one request through Proxy.ServeHTTP with the default
// picker configuration over 8 endpoints: read, parse, hash, route, pick,
// forward (in memory), read usage, Done.
func BenchmarkProxy(b *testing.B) {
	resp := []byte(`{"id":"x","object":"chat.completion","model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}`)
	pk, err := picker.New(picker.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	var eps []*signals.Endpoint
	for i := range 8 {
		eps = append(eps, signals.NewEndpoint(signals.EndpointSpec{Address: fmt.Sprintf("10.0.0.%d:8000", i)}))
	}
	pk.SetEndpoints(eps)
	tab, err := NewTable(TableConfig{Pools: []PoolConfig{{Name: "p", Picker: pk, Models: []string{"meta-llama/Llama-3.1-8B-Instruct"}}}})
	if err != nil {
		b.Fatal(err)
	}
	p, err := NewProxy(tab, Config{Transport: cannedTransport{resp}})
	if err != nil {
		b.Fatal(err)
	}
	// With an access log, the line written as JSON to nowhere: what
	// Config.AccessLog costs a request.
	logged, err := NewProxy(tab, Config{Transport: cannedTransport{resp},
		AccessLog: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	// With a span per request, recorded by the SDK and dropped: what
	// Config.TracerProvider costs a request before any exporter's work.
	traced, err := NewProxy(tab, Config{Transport: cannedTransport{resp},
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))})
	if err != nil {
		b.Fatal(err)
	}
	for _, bb := range prepareBodies() {
		body := bytes.Replace(bb.body, []byte(`"stream":true`), []byte(`"stream":false`), 1)
		b.Run(bb.name, func(b *testing.B) { serveBench(b, p, body) })
		if bb.name == "1KB" {
			b.Run("1KB-accesslog", func(b *testing.B) { serveBench(b, logged, body) })
			b.Run("1KB-traced", func(b *testing.B) { serveBench(b, traced, body) })
		}
	}
}

// serveBench serves body through p, a 200 expected, b.N times.
func serveBench(b *testing.B, p *Proxy, body []byte) {
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	rd := bytes.NewReader(body)
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", rd)
	for b.Loop() {
		rd.Reset(body)
		w := httptest.NewRecorder()
		p.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatal(w.Code, w.Body.String())
		}
	}
}
