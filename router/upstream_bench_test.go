package router

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
)

// BenchmarkUpstream compares one upstream exchange (a 1 KB POST, a 350-byte
// JSON answer, over loopback to a net/http server) through the built-in
// client and through net/http.Transport configured by NewTransport, in one
// run, so that their ratio is meaningful on a noisy machine. Both sides
// include the server's cost.
func BenchmarkUpstream(b *testing.B) {
	answer := []byte(`{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,` +
		`"finish_reason":"stop","message":{"role":"assistant","content":"I am fine, how "}}],` +
		`"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		_, _ = w.Write(answer)
	}))
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	body := bytes.Repeat([]byte("x"), 1024)
	header := http.Header{"Content-Type": {"application/json"}, "Accept-Encoding": {"identity"}}
	buf := make([]byte, 4096)
	readBody := func(b *testing.B, resp *http.Response) {
		for {
			_, err := resp.Body.Read(buf)
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		_ = resp.Body.Close()
	}

	b.Run("builtin", func(b *testing.B) {
		cl := newH1Client()
		req := &h1Request{method: http.MethodPost, addr: addr, path: "/v1/chat/completions",
			header: header, body: body, sendLength: true}
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			resp, err := cl.do(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			readBody(b, resp)
		}
	})
	b.Run("net-http-transport", func(b *testing.B) {
		tr := NewTransport()
		defer tr.CloseIdleConnections()
		u := &url.URL{Scheme: "http", Host: addr, Path: "/v1/chat/completions"}
		b.ReportAllocs()
		for b.Loop() {
			req := &http.Request{Method: http.MethodPost, URL: u, Header: header, Host: addr,
				Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body))}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			readBody(b, resp)
		}
	})
}
