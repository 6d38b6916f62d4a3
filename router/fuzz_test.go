package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferroute/inferroute/signals/prefix"
)

// The router reads three things that arrive from outside with hand-written
// scanners instead of encoding/json and net/http: request bodies
// (ParseRequest), the usage in responses (parseUsage) and upstream
// responses (the HTTP/1.1 client). These fuzz targets check each against
// the standard library's reading of the same bytes. `go test` runs their
// seeds; `go test -fuzz=FuzzParseRequest ./router` explores.

// fuzzBodies seeds the body fuzzers with the recorded OpenAI requests and
// responses and some edge cases.
func fuzzBodies(f *testing.F) {
	for _, b := range []string{
		`{}`, `{"model":"m"}`, `{"model":"a\"b\u00e9"}`, `{"model":1}`, `{"model":"m","model":"n"}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","max_tokens":16,"max_completion_tokens":32}`, `{"max_tokens":1e2}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"user":"u"}`,
		`{"model":"m","prompt":[1,2,3]}`, `{"model":"m","input":"x"}`, ` {"model":"m"} `,
		`{"model":"m"}x`, `{"model":"m"`, `[1]`, `not json`, ``, `{"a":[{"b":{}}],"model":"\ud83d\ude00"}`,
		`{"usage":{"prompt_tokens":5,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":2}}}`,
		`{"response":{"usage":{"input_tokens":3,"output_tokens":4}}}`,
	} {
		f.Add([]byte(b))
	}
	files, _ := filepath.Glob(filepath.Join(fixtures, "*", "*.json"))
	for _, name := range files {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b)
		}
	}
}

// FuzzParseRequest checks ParseRequest against encoding/json: it never
// panics; an object whose structure is malformed is an error (the
// contents of skipped strings and numbers are the model server's to
// check: structureOf); a JSON object encoding/json accepts parses (unless
// a known field has the wrong type) to the same model and stream flag,
// escaped keys included; ParseRequestPrompt agrees with it; and
// RewriteModel changes the model and nothing else.
func FuzzParseRequest(f *testing.F) {
	fuzzBodies(f)
	pr := prefix.NewHasher(prefix.HashConfig{}).NewPrompt()
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := ParseRequest("/v1/chat/completions", nil, body, ParseOptions{})
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		p2, err2 := ParseRequestPrompt("/v1/chat/completions", nil, body, ParseOptions{}, pr)
		if err == nil && err2 == nil && (p2.Model != p.Model || p2.Stream != p.Stream || p2.SessionKey != p.SessionKey ||
			p2.MaxOutputTokens != p.MaxOutputTokens || p2.IncludeUsage != p.IncludeUsage) {
			t.Fatalf("ParseRequestPrompt %+v, ParseRequest %+v", p2, p)
		}
		if err != nil && err2 == nil {
			t.Fatalf("ParseRequest fails (%v), ParseRequestPrompt does not", err)
		}
		if !p.JSON {
			if err == nil && bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) {
				t.Fatal("an object parsed as not JSON")
			}
			return
		}
		if !json.Valid(body) {
			if err == nil && !json.Valid(structureOf(body)) {
				t.Fatalf("malformed JSON accepted as %+v", p)
			}
			return
		}
		var ref map[string]json.RawMessage // exact keys, the last of duplicates, as ParseRequest
		if json.Unmarshal(body, &ref) != nil {
			t.Fatal("encoding/json validates an object it cannot decode")
		}
		if err != nil {
			var fe *fieldError
			if !errors.As(err, &fe) {
				t.Fatalf("valid JSON object rejected: %v", err)
			}
			return
		}
		var m string
		if v, ok := ref["model"]; ok && json.Unmarshal(v, &m) == nil && m != p.Model {
			t.Fatalf("model %q, encoding/json %q", p.Model, m)
		}
		var s bool
		if v, ok := ref["stream"]; ok && json.Unmarshal(v, &s) == nil && s != p.Stream {
			t.Fatalf("stream %v, encoding/json %v", p.Stream, s)
		}
		if !p.HasModel() {
			return
		}
		const to = "served/\"model\"\u00e9"
		out := p.RewriteModel(body, to)
		if !json.Valid(out) {
			t.Fatalf("rewritten body is not JSON: %q", out)
		}
		q, err := ParseRequest("/v1/chat/completions", nil, out, ParseOptions{})
		if err != nil || q.Model != to {
			t.Fatalf("rewritten body parses to model %q, %v", q.Model, err)
		}
		var a, b map[string]json.RawMessage
		if json.Unmarshal(body, &a) != nil || json.Unmarshal(out, &b) != nil {
			t.Fatal("rewritten body is not an object")
		}
		delete(a, "model")
		delete(b, "model")
		if len(a) != len(b) {
			t.Fatalf("rewrite changed the fields: %d before, %d after", len(a), len(b))
		}
		for k, v := range a {
			if !bytes.Equal(v, b[k]) {
				t.Fatalf("rewrite changed %q: %s → %s", k, v, b[k])
			}
		}
	})
}

// structureOf returns b with the contents of every string removed and
// every number replaced by 0: what is left is what ParseRequest checks in
// the values it skips (objects, arrays, where strings end, literals).
func structureOf(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			j := i + 1
			for j < len(b) && b[j] != '"' {
				if b[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(b) {
				return append(out, b[i:]...) // unterminated
			}
			out = append(out, '"', '"')
			i = j + 1
		case c == '-' || '0' <= c && c <= '9':
			i++
			for i < len(b) && strings.IndexByte("-+.eE0123456789", b[i]) >= 0 {
				i++
			}
			out = append(out, '0')
		default:
			out = append(out, c)
			i++
		}
	}
	return out
}

// FuzzParseUsage checks the usage reader against encoding/json: it never
// panics, and where encoding/json reads integer token counts from a
// well-formed usage object, parseUsage reads the same, repeated keys
// included (both keep the last).
func FuzzParseUsage(f *testing.F) {
	fuzzBodies(f)
	f.Fuzz(func(t *testing.T, obj []byte) {
		u, ok := parseUsage(obj)
		out := rewriteModelField(obj, "m2")
		if !bytes.Equal(out, obj) && json.Valid(obj) && !json.Valid(out) {
			t.Fatalf("rewriteModelField made valid JSON invalid: %q", out)
		}
		if !json.Valid(obj) {
			return
		}
		field := func(obj json.RawMessage, key string) (json.RawMessage, bool) {
			var m map[string]json.RawMessage
			if json.Unmarshal(obj, &m) != nil {
				return nil, false
			}
			v, ok := m[key]
			return v, ok
		}
		count := func(obj json.RawMessage, key string) (int, bool) {
			var n int
			v, ok := field(obj, key)
			return n, ok && json.Unmarshal(v, &n) == nil
		}
		uv, found := field(obj, "usage")
		if !found || !bytes.HasPrefix(uv, []byte("{")) {
			return
		}
		if !ok {
			t.Fatalf("encoding/json reads a usage object, parseUsage does not: %q", obj)
		}
		if n, ok := count(uv, "prompt_tokens"); ok && n != u.prompt {
			t.Fatalf("prompt tokens %d, encoding/json %d", u.prompt, n)
		}
		if n, ok := count(uv, "completion_tokens"); ok && n != u.completion {
			t.Fatalf("completion tokens %d, encoding/json %d", u.completion, n)
		}
		if d, ok := field(uv, "prompt_tokens_details"); ok {
			if n, ok := count(d, "cached_tokens"); ok && n != u.cached {
				t.Fatalf("cached tokens %d, encoding/json %d", u.cached, n)
			}
		}
	})
}

// nopConn is a net.Conn that discards writes; reads come from the
// h1Conn's bufio.Reader, which the fuzz target fills.
type nopConn struct{ net.Conn }

func (nopConn) Write(p []byte) (int, error)      { return len(p), nil }
func (nopConn) Close() error                     { return nil }
func (nopConn) SetDeadline(time.Time) error      { return nil }
func (nopConn) SetReadDeadline(time.Time) error  { return nil }
func (nopConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzUpstreamResponse checks the HTTP/1.1 client's response reader
// against net/http.ReadResponse on the same bytes: it never panics or
// hangs, and where both read a final response and its body to the end,
// they agree on the status, the body and the header fields.
func FuzzUpstreamResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: application/json\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nuntil close",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\nno",
		"HTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 200 OK\nContent-Length: 1\nX-Fold: a\n b\n\nz",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n1e\r\ndata: {\"choices\":[]}\n\ndata: [\r\n0\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	t1 := newH1Client()
	t1.maxIdle = 0 // finished connections are closed, not pooled
	f.Fuzz(func(t *testing.T, raw []byte) {
		pc := &h1Conn{host: &h1Host{}, nc: nopConn{}, br: bufio.NewReaderSize(bytes.NewReader(raw), 4096)}
		pc.abort = pc.interrupt // as h1Client.get sets it
		req := &h1Request{method: http.MethodPost, addr: "127.0.0.1:1", path: "/v1/chat/completions", body: []byte("{}"), sendLength: true}
		resp, err := pc.exchange(t1, context.Background(), req)
		var body []byte
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}

		var (
			ref     *http.Response
			refBody []byte
			refErr  error
		)
		br := bufio.NewReaderSize(bytes.NewReader(raw), 4096)
		refReq := &http.Request{Method: http.MethodPost}
		for {
			ref, refErr = http.ReadResponse(br, refReq)
			if refErr != nil || ref.StatusCode >= 200 || ref.StatusCode == http.StatusSwitchingProtocols {
				break
			}
		}
		if refErr == nil {
			refBody, refErr = io.ReadAll(ref.Body)
		}
		if err != nil || refErr != nil {
			return // the two may differ in what they refuse; neither may panic
		}
		if resp.StatusCode != ref.StatusCode {
			t.Fatalf("status %d, net/http %d", resp.StatusCode, ref.StatusCode)
		}
		if !bytes.Equal(body, refBody) {
			t.Fatalf("body %q, net/http %q", body, refBody)
		}
		for k, v := range ref.Header {
			if k == "Content-Length" || k == "Transfer-Encoding" {
				continue // net/http moves framing fields out of Header
			}
			if got := resp.Header[k]; strings.Join(got, "\x00") != strings.Join(v, "\x00") {
				t.Fatalf("header %s: %q, net/http %q", k, got, v)
			}
		}
		for k := range resp.Header {
			if _, ok := ref.Header[k]; !ok && k != "Content-Length" && k != "Transfer-Encoding" {
				t.Fatalf("header %s: %q, not read by net/http", k, resp.Header[k])
			}
		}
	})
}
