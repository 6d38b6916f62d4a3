package router

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/internal/nettest"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/prefix"
)

// edgeChat is a minimal chat completion request for the base model.
const edgeChat = `{"model":"` + baseModel + `","messages":[{"role":"user","content":"hi"}]}`

// rawOnce is a TCP server that reads each request's head with net/http's
// parser and then calls h with the connection and the buffered reader
// (the request body is not read unless h reads it).
func rawOnce(t *testing.T, h func(c net.Conn, br *bufio.Reader, r *http.Request)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				r, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				h(c, br, r)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestProxyStripsClientDestinationHeader: a client-supplied
// x-gateway-destination-endpoint must never reach the upstream, also when
// Config.EndpointHeader is not set (TestProxyHeaderSpoofing sets it, which would hide
// whether the client's header is stripped).
func TestProxyStripsClientDestinationHeader(t *testing.T) {
	addr, got := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e := newEnv(t, Config{}, addr)
	r := e.post(t, "/v1/chat/completions", edgeChat, http.Header{
		"X-Gateway-Destination-Endpoint": {"10.66.66.66:8000"},
	})
	require.Equal(t, 200, r.StatusCode)
	s := <-got
	assert.Empty(t, s.header.Values(HeaderDestination),
		"the client's routing header must be stripped before forwarding")
	e.rec.next(t)
}

// TestProxyStripsClientDestinationHeaderBeforePicking: the picker sees the
// request headers (signals.Request.Headers); a client routing header must
// be gone before picking.
func TestProxyStripsClientDestinationHeaderBeforePicking(t *testing.T) {
	addr, _ := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e := newEnv(t, Config{}, addr)
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	r.Header.Set(HeaderDestination, "10.66.66.66:8000")
	h, err := e.proxy.cleanHeader(r, nil) // the headers handed to the picker and forwarded
	require.NoError(t, err)
	assert.Empty(t, h.Values(HeaderDestination))
}

// TestProxyNonSSEBrokenBeforeFirstByte: an upstream that sends the head of
// a 200 text/plain chunked response and then drops the connection before
// any body byte. The client must not receive a complete-looking (empty)
// 200: it gets a 502 in OpenAI's shape.
func TestProxyNonSSEBrokenBeforeFirstByte(t *testing.T) {
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n", true
	})
	e := newEnv(t, Config{}, s.addr())
	req, err := http.NewRequest(http.MethodPost, e.front.URL+"/v1/chat/completions", strings.NewReader(edgeChat))
	require.NoError(t, err)
	resp, err := e.front.Client().Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "body %q", b)
	assert.Contains(t, string(b), `"code":"upstream_stream_error"`)
	o := e.rec.next(t)
	assert.ErrorIs(t, o.out.Err, ErrStreamBroken)
	e.requireIdle(t)
}

// TestProxyOversizedChunkedJSONTruncated: a JSON response without a
// Content-Length that outgrows MaxResponseBuffer is streamed through; if it
// then breaks off, the client must see a failed response, not a complete
// one (a truncated JSON body must not look complete).
func TestProxyOversizedChunkedJSONTruncated(t *testing.T) {
	chunk := `{"id":"x","choices":[{"message":{"content":"` + strings.Repeat("a", 4000)
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
			strconv.FormatInt(int64(len(chunk)), 16) + "\r\n" + chunk + "\r\n", true // no last chunk: broken
	})
	e := newEnv(t, Config{MaxResponseBuffer: 1024}, s.addr())
	req, err := http.NewRequest(http.MethodPost, e.front.URL+"/v1/chat/completions", strings.NewReader(edgeChat))
	require.NoError(t, err)
	resp, err := e.front.Client().Do(req)
	if err == nil {
		b, rerr := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		assert.Error(t, rerr, "the client read a complete-looking %d body of %d bytes (upstream sent a truncated one)",
			resp.StatusCode, len(b))
	}
	o := e.rec.next(t)
	assert.ErrorIs(t, o.out.Err, ErrStreamBroken)
	e.requireIdle(t)
}

// TestProxyEarlyResponseBeforeBodyRead: the backend answers (here 413)
// before reading the request body and closes the connection, as servers
// do for a body they refuse. The proxy must relay that answer, not treat
// the endpoint as unreachable (which marks it down and retries a request
// the endpoint already refused on the fallbacks).
func TestProxyEarlyResponseBeforeBodyRead(t *testing.T) {
	const errBody = `{"error":{"message":"too long","type":"invalid_request_error","param":null,"code":null}}`
	for _, tc := range []struct {
		name string
		size int
		tr   bool
	}{
		{"220KiB", 220 << 10, false},
		{"3MiB", 3 << 20, false},
		{"32MiB", 32 << 20, false},
		{"32MiB over net/http", 32 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size := tc.size
			addr := rawOnce(t, func(c net.Conn, _ *bufio.Reader, _ *http.Request) {
				_, _ = io.WriteString(c, "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "+
					strconv.Itoa(len(errBody))+"\r\n\r\n"+errBody)
				// As net/http's server does for a body it will not read:
				// half-close, linger, then close (the unread body makes the
				// close a reset).
				_ = c.(*net.TCPConn).CloseWrite()
				time.Sleep(300 * time.Millisecond)
			})
			good, gotGood := backend(t, jsonHandler(200, []byte(`{}`), nil))
			cfg := Config{MaxBodyBytes: 64 << 20}
			if tc.tr {
				tr := NewTransport()
				t.Cleanup(tr.CloseIdleConnections)
				cfg.Transport = tr
			}
			e := newEnv(t, cfg, addr, good)
			body := `{"model":"` + baseModel + `","prompt":"` + strings.Repeat("x", size) + `"}`
			r := e.post(t, "/v1/completions", body, nil)
			b, _ := io.ReadAll(r.Body)
			assert.Equal(t, 413, r.StatusCode, "the backend's early answer is relayed; got %s", b)
			assert.Empty(t, gotGood, "a request the backend refused is not retried elsewhere")
			o := e.rec.next(t)
			assert.Equal(t, "ep0", o.ep)
			assert.False(t, o.out.ConnectError, "an endpoint that answered is not a connect error (err %v)", o.out.Err)
			assert.True(t, e.eps[0].Healthy(), "an endpoint that answered stays up")
			e.requireIdle(t)
		})
	}
}

// TestProxyHeadJSONContentLength: a HEAD response has no body, but its
// Content-Length describes the entity; the proxy must not rewrite it to 0.
func TestProxyHeadJSONContentLength(t *testing.T) {
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 42\r\n\r\n", false
	})
	e := newEnv(t, Config{}, s.addr())
	req, err := http.NewRequest(http.MethodHead, e.front.URL+"/v1/files/abc", nil)
	require.NoError(t, err)
	resp, err := e.front.Client().Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "42", resp.Header.Get("Content-Length"), "HEAD keeps the upstream's Content-Length")
	e.rec.next(t)
	e.requireIdle(t)
}

// TestProxyInvalidClientHeaderValue: a request whose header value carries
// CR/LF (possible when the Proxy is called by another handler or server
// that does not validate) must not be written upstream (it is not: the
// injection is refused), must be answered 400, and must not mark the
// endpoints down as if they were unreachable (one bad request would take
// every endpoint of the pool out of rotation).
func TestProxyInvalidClientHeaderValue(t *testing.T) {
	var addrs []string
	var gots []chan seen
	for range 3 {
		a, g := backend(t, jsonHandler(200, []byte(`{}`), nil))
		addrs, gots = append(addrs, a), append(gots, g)
	}
	e := newEnv(t, Config{}, addrs...)
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(edgeChat))
	req.Header["X-Evil"] = []string{"a\r\nX-Gateway-Destination-Endpoint: 10.6.6.6:1"}
	w := httptest.NewRecorder()
	e.proxy.ServeHTTP(w, req)
	for _, g := range gots {
		assert.Empty(t, g, "nothing reached an upstream")
	}
	assert.Equal(t, 400, w.Code, "a malformed header is the client's error: %s", w.Body.String())
	for _, ep := range e.eps {
		assert.True(t, ep.Healthy(), "a client's bad header does not mark %s down", ep.Name)
	}
	e.requireIdle(t)
}

// TestProxyNoResendAfterInterimResponse: a reused connection that closes
// after a 1xx interim response has shown that the server received the
// request; the request must not be sent again on a new connection.
func TestProxyNoResendAfterInterimResponse(t *testing.T) {
	s := newRawServer(t, func(n int, _ *http.Request) (string, bool) {
		switch n {
		case 0:
			return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
		case 1:
			return "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n", true
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	cl := newH1Client()
	resp, err := cl.do(context.Background(), postTo(s.addr(), "{}"))
	require.NoError(t, err)
	assert.Equal(t, "ok", readAll(t, resp))
	resp, err = cl.do(context.Background(), postTo(s.addr(), "{}"))
	if err == nil {
		readAll(t, resp)
	}
	s.mu.Lock()
	n := len(s.reqs)
	s.mu.Unlock()
	assert.Equal(t, 2, n, "the request was sent again after the server had answered 103")
	assert.Error(t, err)
}

// TestProxyResponseConnectionNamedHeaders: hop-by-hop headers of the
// response, and those named in its Connection header, do not reach the
// client.
func TestProxyResponseConnectionNamedHeaders(t *testing.T) {
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive, X-Foo\r\nX-Foo: secret\r\n" +
			"Keep-Alive: timeout=5\r\nX-Bar: ok\r\nContent-Length: 2\r\n\r\n{}", false
	})
	e := newEnv(t, Config{}, s.addr())
	r := e.post(t, "/v1/chat/completions", edgeChat, nil)
	require.Equal(t, 200, r.StatusCode)
	assert.Empty(t, r.Header.Get("X-Foo"))
	assert.Empty(t, r.Header.Get("Keep-Alive"))
	assert.Equal(t, "ok", r.Header.Get("X-Bar"))
	e.rec.next(t)
}

// TestProxyRequestConnectionNamedHeaders: request headers named in
// Connection (several fields, mixed case, repeated Connection headers) are
// stripped.
func TestProxyRequestConnectionNamedHeaders(t *testing.T) {
	addr, got := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e := newEnv(t, Config{}, addr)
	r := e.post(t, "/v1/chat/completions", edgeChat, http.Header{
		"Connection": {"keep-alive, x-foo", "X-BAZ"},
		"X-Foo":      {"1"},
		"X-Baz":      {"2"},
		"Keep-Alive": {"timeout=5"},
		"Upgrade":    {"websocket"},
		"X-Keep":     {"3"},
	})
	require.Equal(t, 200, r.StatusCode)
	s := <-got
	for _, h := range []string{"X-Foo", "X-Baz", "Keep-Alive", "Upgrade"} {
		assert.Empty(t, s.header.Get(h), h)
	}
	assert.Equal(t, "3", s.header.Get("X-Keep"))
	e.rec.next(t)
}

// TestProxyDoneOncePerPath counts the picker's Done calls on many paths.
func TestProxyDoneOncePerPath(t *testing.T) {
	ok := []byte(`{"usage":{"prompt_tokens":3,"completion_tokens":4}}`)
	tests := []struct {
		name  string
		raw   string
		close bool
	}{
		{"malformed chunk size", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", true},
		{"short content-length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":1}", true},
		{"duplicate differing content-length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", true},
		{"te and cl", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", false},
		{"100 continue then 200", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(ok)) + "\r\n\r\n" + string(ok), false},
		{"no length, read to close", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + string(ok), true},
		{"sse truncated", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 1000\r\n\r\ndata: {\"a\":1}\n\n", true},
		{"empty reply", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newRawServer(t, func(int, *http.Request) (string, bool) {
				if tt.raw == "" {
					return "x", true // garbage status line
				}
				return tt.raw, tt.close
			})
			e := newEnv(t, Config{MaxRetries: -1}, s.addr())
			req, err := http.NewRequest(http.MethodPost, e.front.URL+"/v1/chat/completions", strings.NewReader(edgeChat))
			require.NoError(t, err)
			resp, err := e.front.Client().Do(req)
			if err == nil {
				_, _ = io.ReadAll(resp.Body)
				_ = resp.Body.Close()
			}
			e.rec.next(t)
			time.Sleep(50 * time.Millisecond)
			assert.Equal(t, 1, e.rec.count(), "one Done per pick")
			e.requireIdle(t)
		})
	}
}

// TestProxyTruncatedJSONIs502: a JSON body shorter than its Content-Length
// is answered 502, not passed on as a complete 200.
func TestProxyTruncatedJSONIs502(t *testing.T) {
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":1}", true
	})
	e := newEnv(t, Config{MaxRetries: -1}, s.addr())
	r := e.post(t, "/v1/chat/completions", edgeChat, nil)
	requireAPIError(t, r, 502, "upstream_stream_error")
	o := e.rec.next(t)
	assert.ErrorIs(t, o.out.Err, ErrStreamBroken)
}

// TestProxySSELongLinesAndSplitReads: SSE data lines far longer than the
// reader's buffer, sent in small pieces, are relayed whole with the alias
// rewritten in each, and usage is read from the last chunk.
func TestProxySSELongLinesAndSplitReads(t *testing.T) {
	big := strings.Repeat("y", 70<<10)
	events := []string{
		`data: {"id":"1","model":"` + baseModel + `","choices":[{"delta":{"content":"` + big + `"}}]}` + "\n\n",
		`data: {"id":"2","model":"` + baseModel + `","choices":[{"delta":{"content":"z"}}]}` + "\r\n\r\n",
		`data: {"id":"3","model":"` + baseModel + `","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6}}` + "\n\n",
		"data: [DONE]\n\n",
	}
	addr, _ := backend(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		all := strings.Join(events, "")
		for i := 0; i < len(all); i += 7 {
			_, _ = io.WriteString(w, all[i:min(i+7, len(all))])
			if i%(7*1000) == 0 {
				w.(http.Flusher).Flush()
			}
		}
	})
	e := newEnv(t, Config{}, addr)
	r := e.post(t, "/v1/chat/completions", `{"model":"llama","stream":true}`, nil)
	require.Equal(t, 200, r.StatusCode)
	b, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	got := string(b)
	assert.NotContains(t, got, baseModel)
	assert.Equal(t, 3, strings.Count(got, `"model":"llama"`))
	assert.Contains(t, got, big)
	assert.True(t, strings.HasSuffix(got, "data: [DONE]\n\n"))
	assert.NotContains(t, got, "upstream_stream_error")
	o := e.rec.next(t)
	require.NoError(t, o.out.Err)
	assert.Equal(t, 5, o.out.PromptTokens)
	assert.Equal(t, 6, o.out.CompletionTokens)
}

// TestProxyClientDisconnectMidSSE: the client goes away in the middle of
// a stream (after the watch period); the upstream request is cancelled,
// Done is called once with the cancellation, and the connection is not
// pooled.
func TestProxyClientDisconnectMidSSE(t *testing.T) {
	upstreamGone := make(chan struct{})
	addr, _ := backend(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; ; i++ {
			_, err := io.WriteString(w, `data: {"i":`+strconv.Itoa(i)+"}\n\n")
			if err != nil {
				break
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				close(upstreamGone)
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		close(upstreamGone)
	})
	e := newEnv(t, Config{}, addr)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.front.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"sql-lora","stream":true}`))
	require.NoError(t, err)
	resp, err := e.front.Client().Do(req)
	require.NoError(t, err)
	br := bufio.NewReader(resp.Body)
	for range 10 {
		readEvent(t, br)
	}
	cancel()
	_ = resp.Body.Close()
	select {
	case <-upstreamGone:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
	o := e.rec.next(t)
	assert.ErrorIs(t, o.out.Err, context.Canceled)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, 1, e.rec.count())
	e.requireIdle(t)
}

// TestProxyConcurrentMixed runs many concurrent requests mixing success,
// 5xx retries and SSE, under -race, and checks one Done per attempt: the
// pick's and, after each 503, its retry's.
func TestProxyConcurrentMixed(t *testing.T) {
	var mu sync.Mutex
	n500, failed := 0, 0
	flaky, _ := backend(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n500++
		odd := n500%2 == 1
		if odd {
			failed++
		}
		mu.Unlock()
		if odd {
			jsonHandler(503, []byte(`{"error":{}}`), nil)(w, r)
			return
		}
		sseHandler([]string{"data: {\"a\":1}\n\n", "data: [DONE]\n\n"}, nil, nil)(w, r)
	})
	good, _ := backend(t, sseHandler([]string{"data: {\"a\":1}\n\n", "data: [DONE]\n\n"}, nil, nil))
	e := newEnv(t, Config{}, flaky, good)
	const n = 60
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"%s","stream":true,"messages":[{"role":"user","content":"r%d"}]}`, baseModel, i)
			r, err := e.front.Client().Post(e.front.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if !assert.NoError(t, err) {
				return
			}
			defer r.Body.Close()
			b, _ := io.ReadAll(r.Body)
			assert.Equal(t, 200, r.StatusCode)
			assert.True(t, strings.HasSuffix(string(b), "data: [DONE]\n\n"), "%q", b)
		}()
	}
	wg.Wait()
	mu.Lock()
	attempts := n + failed // each 503 retried once, on the healthy fallback
	mu.Unlock()
	require.Positive(t, failed)
	for range attempts {
		e.rec.next(t)
	}
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, attempts, e.rec.count())
	e.requireIdle(t)
}

// TestProxyErrorShapes checks the OpenAI error shape of the 400 and 413
// answers for bodies sent chunked (no Content-Length).
func TestProxyErrorShapes(t *testing.T) {
	addr, _ := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e := newEnv(t, Config{MaxBodyBytes: 128}, addr)
	pr, pw := io.Pipe()
	go func() {
		_, _ = io.WriteString(pw, `{"model":"`+baseModel+`","prompt":"`+strings.Repeat("x", 1000)+`"}`)
		_ = pw.Close()
	}()
	req, err := http.NewRequest(http.MethodPost, e.front.URL+"/v1/completions", pr)
	require.NoError(t, err)
	r, err := e.front.Client().Do(req)
	require.NoError(t, err)
	defer r.Body.Close()
	requireAPIError(t, r, 413, "request_too_large")
	var v map[string]any
	r2 := e.post(t, "/v1/chat/completions", `{"model":`, nil)
	b, _ := io.ReadAll(r2.Body)
	require.NoError(t, json.Unmarshal(b, &v))
	assert.Equal(t, 400, r2.StatusCode)
}

// TestProxyLongResponseHeaderLine: one response header line of 40 KiB is
// well under the documented bound of the response head
// (maxResponseHeaderBytes, 1 MiB), and under net/http's; it must be
// accepted.
func TestProxyLongResponseHeaderLine(t *testing.T) {
	long := strings.Repeat("c", 40<<10)
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Long: " + long + "\r\nContent-Length: 2\r\n\r\n{}", false
	})
	e := newEnv(t, Config{MaxRetries: -1}, s.addr())
	r := e.post(t, "/v1/chat/completions", edgeChat, nil)
	b, _ := io.ReadAll(r.Body)
	assert.Equal(t, 200, r.StatusCode, "%s", b)
	assert.Equal(t, len(long), len(r.Header.Get("X-Long")))
	o := e.rec.next(t)
	assert.False(t, o.out.ConnectError, "%v", o.out.Err)
	assert.True(t, e.eps[0].Healthy())
}

// TestProxyManyResponseHeaders: 20000 small header fields (under 1 MiB)
// are accepted and relayed.
func TestProxyManyResponseHeaders(t *testing.T) {
	var sb strings.Builder
	sb.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
	for i := range 20000 {
		fmt.Fprintf(&sb, "X-H%d: v%d\r\n", i, i)
	}
	sb.WriteString("Content-Length: 2\r\n\r\n{}")
	raw := sb.String()
	require.Less(t, len(raw), maxResponseHeaderBytes)
	s := newRawServer(t, func(int, *http.Request) (string, bool) { return raw, false })
	e := newEnv(t, Config{MaxRetries: -1}, s.addr())
	r := e.post(t, "/v1/chat/completions", edgeChat, nil)
	b, _ := io.ReadAll(r.Body)
	require.Equal(t, 200, r.StatusCode, "%s", b)
	assert.Equal(t, "v19999", r.Header.Get("X-H19999"))
	e.rec.next(t)
}

// TestProxyHugeResponseHeadRejected: a response head over 1 MiB is
// refused (502), without hanging.
func TestProxyHugeResponseHeadRejected(t *testing.T) {
	var sb strings.Builder
	sb.WriteString("HTTP/1.1 200 OK\r\n")
	for i := 0; sb.Len() < maxResponseHeaderBytes+1024; i++ {
		fmt.Fprintf(&sb, "X-H%d: %s\r\n", i, strings.Repeat("v", 1000))
	}
	sb.WriteString("Content-Length: 2\r\n\r\n{}")
	raw := sb.String()
	s := newRawServer(t, func(int, *http.Request) (string, bool) { return raw, true })
	e := newEnv(t, Config{MaxRetries: -1}, s.addr())
	r := e.post(t, "/v1/chat/completions", edgeChat, nil)
	assert.Equal(t, 502, r.StatusCode)
	e.rec.next(t)
	e.requireIdle(t)
}

// TestProxyUnreadErrorBodyNotReused: a 503 whose body is larger than the
// proxy drains before retrying leaves its connection unusable; the next
// request to that endpoint must get its own response, not the rest of the
// previous body.
func TestProxyUnreadErrorBodyNotReused(t *testing.T) {
	bigErr := `{"error":{"message":"` + strings.Repeat("e", 100<<10) + `"}}`
	s := newRawServer(t, func(n int, _ *http.Request) (string, bool) {
		if n == 0 {
			return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
				strconv.Itoa(len(bigErr)) + "\r\n\r\n" + bigErr, false
		}
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"second\":1}", false
	})
	good, _ := backend(t, jsonHandler(200, []byte(`{"fallback":1}`), nil))
	e := newEnv(t, Config{}, s.addr(), good)
	r := e.post(t, "/v1/chat/completions", edgeChat, nil)
	b, _ := io.ReadAll(r.Body)
	assert.Equal(t, `{"fallback":1}`, string(b))
	e.rec.next(t)
	r = e.post(t, "/v1/chat/completions", edgeChat, nil)
	b, _ = io.ReadAll(r.Body)
	assert.Equal(t, 200, r.StatusCode)
	assert.Equal(t, `{"second":1}`, string(b))
	e.rec.next(t)
	assert.Equal(t, int32(2), s.conns.Load(), "the connection with an unread body was not reused")
	e.requireIdle(t)
}

// TestProxyKeepAliveReuseAfterFullRead: complete chunked SSE and JSON
// responses leave their connection reusable.
func TestProxyKeepAliveReuseAfterFullRead(t *testing.T) {
	s := newRawServer(t, func(n int, _ *http.Request) (string, bool) {
		if n%2 == 0 {
			ev := "data: {\"a\":1}\n\ndata: [DONE]\n\n"
			return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
				strconv.FormatInt(int64(len(ev)), 16) + "\r\n" + ev + "\r\n0\r\n\r\n", false
		}
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", false
	})
	e := newEnv(t, Config{}, s.addr())
	for i := range 6 {
		r := e.post(t, "/v1/chat/completions", edgeChat, nil)
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		assert.NotContains(t, string(b), "error", "request %d", i)
		assert.NoError(t, e.rec.next(t).out.Err)
	}
	assert.Equal(t, int32(1), s.conns.Load())
}

// TestProxyTimeoutDoesNotCutStream: UpstreamTimeout bounds the wait for
// the response head only; a stream that lasts longer is relayed whole.
func TestProxyTimeoutDoesNotCutStream(t *testing.T) {
	events := []string{"data: {\"a\":1}\n\n", "data: {\"a\":2}\n\n", "data: {\"a\":3}\n\n", "data: [DONE]\n\n"}
	addr, _ := backend(t, sseHandler(events, nil, func(int) { time.Sleep(60 * time.Millisecond) }))
	e := newEnv(t, Config{UpstreamTimeout: 100 * time.Millisecond}, addr)
	r := e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`","stream":true}`, nil)
	require.Equal(t, 200, r.StatusCode)
	b, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	assert.Equal(t, strings.Join(events, ""), string(b))
	assert.NoError(t, e.rec.next(t).out.Err)
	e.requireIdle(t)
}

// TestProxyTimeoutOnFallback: the primary answers 503, the fallback never
// answers: 504, and one Done for each attempt.
func TestProxyTimeoutOnFallback(t *testing.T) {
	bad, _ := backend(t, jsonHandler(503, []byte(`{}`), nil))
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	slow, _ := backend(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	})
	e := newEnv(t, Config{UpstreamTimeout: 50 * time.Millisecond}, bad, slow)
	r := e.post(t, "/v1/chat/completions", edgeChat, nil)
	requireAPIError(t, r, 504, "upstream_timeout")
	o := e.rec.next(t)
	assert.Equal(t, "ep0", o.ep)
	assert.ErrorIs(t, o.out.Err, ErrUpstreamStatus)
	o = e.rec.next(t)
	assert.Equal(t, "ep1", o.ep)
	assert.ErrorIs(t, o.out.Err, ErrUpstreamTimeout)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, 2, e.rec.count())
	e.requireIdle(t)
}

// TestProxySSE5xxRetried: a 5xx SSE answer before any byte reached the
// client is retried on the fallback.
func TestProxySSE5xxRetried(t *testing.T) {
	bad, _ := backend(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(500)
		_, _ = io.WriteString(w, "data: {\"error\":{}}\n\n")
	})
	good, _ := backend(t, sseHandler([]string{"data: {\"a\":1}\n\n", "data: [DONE]\n\n"}, nil, nil))
	e := newEnv(t, Config{}, bad, good)
	r := e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`","stream":true}`, nil)
	require.Equal(t, 200, r.StatusCode)
	b, _ := io.ReadAll(r.Body)
	assert.Equal(t, "data: {\"a\":1}\n\ndata: [DONE]\n\n", string(b))
	o := e.rec.next(t)
	assert.ErrorIs(t, o.out.Err, ErrUpstreamStatus)
	e.requireIdle(t)
}

// TestProxyRepickDoneOnce: every ranked target refuses connections and
// the second pick's choice too: each attempt (the pick, its two
// fallbacks, the second pick) gets exactly one Done, a connect error on
// its own endpoint.
func TestProxyRepickDoneOnce(t *testing.T) {
	e := newEnv(t, Config{}, nettest.RefusedAddr(t), nettest.RefusedAddr(t), nettest.RefusedAddr(t), nettest.RefusedAddr(t))
	r := e.post(t, "/v1/chat/completions", edgeChat, nil)
	requireAPIError(t, r, 502, "upstream_unreachable")
	var eps []string
	for range 4 {
		o := e.rec.next(t)
		assert.True(t, o.out.ConnectError)
		eps = append(eps, o.ep)
	}
	assert.Equal(t, []string{"ep0", "ep1", "ep2", "ep3"}, eps)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, 4, e.rec.count())
	e.requireIdle(t)
}

// TestProxyRequestTargetInjection: a request target with CR/LF or
// spaces (possible when a handler in front of the Proxy rewrites r.URL
// without escaping) must not split the upstream request: no header the
// client chose may appear upstream.
func TestProxyRequestTargetInjection(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tr     bool
		method bool
	}{
		{"query, built-in client", false, false},
		{"query, net/http", true, false},
		{"method, built-in client", false, true},
		{"method, net/http", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, got := backend(t, jsonHandler(200, []byte(`{}`), nil))
			cfg := Config{}
			if tc.tr {
				tr := NewTransport()
				t.Cleanup(tr.CloseIdleConnections)
				cfg.Transport = tr
			}
			e := newEnv(t, cfg, addr)
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(edgeChat))
			if tc.method {
				req.Method = "POST /v1/chat/completions HTTP/1.1\r\nX-Injected: 1\r\nX-Pad:"
			} else {
				req.URL.RawQuery = "a=1 HTTP/1.1\r\nX-Injected: 1\r\nX-Pad: x"
			}
			w := httptest.NewRecorder()
			e.proxy.ServeHTTP(w, req)
			select {
			case s := <-got:
				assert.Empty(t, s.header.Get("X-Injected"), "a header was injected through the request target")
			default:
			}
			assert.NotEqual(t, http.StatusOK, w.Code, "a request target with CR/LF is refused")
		})
	}
}

// TestProxyRetryChain: connect error, then 500, then success: the
// client gets the success, the refused endpoint is marked down, the one
// that answered 500 is not, and each attempt gets one Done.
func TestProxyRetryChain(t *testing.T) {
	bad, gotBad := backend(t, jsonHandler(500, []byte(`{"error":{"message":"boom"}}`), nil))
	good, gotGood := backend(t, jsonHandler(200, []byte(`{"usage":{"prompt_tokens":2,"completion_tokens":3}}`), nil))
	e := newEnv(t, Config{}, nettest.RefusedAddr(t), bad, good)
	r := e.post(t, "/v1/chat/completions", edgeChat, nil)
	b, _ := io.ReadAll(r.Body)
	require.Equal(t, 200, r.StatusCode, "%s", b)
	<-gotBad
	<-gotGood
	o := e.rec.next(t)
	assert.Equal(t, "ep0", o.ep)
	assert.True(t, o.out.ConnectError)
	o = e.rec.next(t)
	assert.Equal(t, "ep1", o.ep)
	assert.ErrorIs(t, o.out.Err, ErrUpstreamStatus)
	o = e.rec.next(t)
	assert.Equal(t, "ep2", o.ep)
	assert.NoError(t, o.out.Err)
	assert.Equal(t, 3, o.out.CompletionTokens, "the usage of the answer served")
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, 3, e.rec.count())
	assert.False(t, e.eps[0].Healthy())
	assert.True(t, e.eps[1].Healthy())
	assert.True(t, e.eps[2].Healthy())
	e.requireIdle(t)
}

// TestProxyUnsupportedTransferCoding: a response under a transfer coding
// other than chunked alone (gzip, chunked; or gzip) must not reach the
// client as a plain body: Transfer-Encoding is stripped as hop-by-hop, so
// the client would take the still gzip-coded bytes for the content. It is
// refused, as net/http refuses it: 502, and the client sees none of it.
func TestProxyUnsupportedTransferCoding(t *testing.T) {
	var gz strings.Builder
	zw := gzip.NewWriter(&gz)
	_, _ = io.WriteString(zw, "hello world")
	require.NoError(t, zw.Close())
	coded := gz.String()
	for name, head := range map[string]string{
		"gzip, chunked": "Transfer-Encoding: gzip, chunked\r\n\r\n" + strconv.FormatInt(int64(len(coded)), 16) + "\r\n" + coded + "\r\n0\r\n\r\n",
		"gzip":          "Transfer-Encoding: gzip\r\n\r\n" + coded,
		"two fields":    "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(coded)), 16) + "\r\n" + coded + "\r\n0\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			s := newRawServer(t, func(int, *http.Request) (string, bool) {
				return "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + head, true
			})
			e := newEnv(t, Config{MaxRetries: -1}, s.addr())
			r := e.post(t, "/v1/chat/completions", edgeChat, nil)
			b, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			assert.Equal(t, http.StatusBadGateway, r.StatusCode, "body %q", b)
			assert.NotContains(t, string(b), coded)
			assert.Contains(t, string(b), "unsupported transfer coding")
			o := e.rec.next(t)
			assert.Error(t, o.out.Err)
			e.requireIdle(t)
		})
	}
}

// TestProxyNoContentJSON: a 204 from the upstream carrying a JSON
// Content-Type reaches the client as a 204 without a Content-Length (RFC
// 9110 section 8.6: a server must not send one in a 204).
func TestProxyNoContentJSON(t *testing.T) {
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 204 No Content\r\nContent-Type: application/json\r\n\r\n", false
	})
	e := newEnv(t, Config{}, s.addr())
	r := e.post(t, "/v1/chat/completions", edgeChat, nil)
	assert.Equal(t, 204, r.StatusCode)
	assert.Empty(t, r.Header.Values("Content-Length"))
	o := e.rec.next(t)
	assert.NoError(t, o.out.Err)
	e.requireIdle(t)
}

// TestProxyNonSSEBrokenAfterBytes: a non-JSON, non-SSE body that
// breaks off after bytes reached the client makes the client's read fail
// (the connection is aborted), for both framings.
func TestProxyNonSSEBrokenAfterBytes(t *testing.T) {
	for _, tc := range []struct{ name, raw string }{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n0123456789"},
		{"chunked", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newRawServer(t, func(int, *http.Request) (string, bool) { return tc.raw, true })
			e := newEnv(t, Config{}, s.addr())
			req, err := http.NewRequest(http.MethodPost, e.front.URL+"/v1/chat/completions", strings.NewReader(edgeChat))
			require.NoError(t, err)
			resp, err := e.front.Client().Do(req)
			if err == nil {
				_, rerr := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				assert.Error(t, rerr)
			}
			o := e.rec.next(t)
			assert.ErrorIs(t, o.out.Err, ErrStreamBroken)
			e.requireIdle(t)
		})
	}
}

// TestStripsRoutingHeadersWhateverTheirCase: the routing headers a client
// may not set are stripped by the Proxy and the Middleware also under a
// key that is not canonical, as a handler in front may set one by hand,
// and Config.StripHeaders adds to them.
func TestStripsRoutingHeadersWhateverTheirCase(t *testing.T) {
	addr, got := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e := newEnv(t, Config{StripHeaders: []string{"x-tenant-route"}}, addr)
	mw, err := NewMiddleware(e.proxy.Table(), Config{StripHeaders: []string{"X-TENANT-ROUTE"}})
	require.NoError(t, err)
	var next http.Header
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next = r.Header
		w.WriteHeader(200)
	}))
	for _, key := range []string{HeaderDestination, "X-Gateway-Destination-Endpoint", "X-GATEWAY-DESTINATION-ENDPOINT", "x-tenant-route", "X-Tenant-Route"} {
		t.Run(key, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(edgeChat))
			req.Header[key] = []string{"10.66.66.66:8000"} // set by hand: not canonicalised
			req.Header["X-Kept"] = []string{"yes"}
			w := httptest.NewRecorder()
			e.proxy.ServeHTTP(w, req)
			require.Equal(t, 200, w.Code, "%s", w.Body)
			s := <-got
			e.rec.next(t)
			for k := range s.header {
				assert.NotEqual(t, strings.ToLower(key), strings.ToLower(k), "forwarded by the Proxy")
			}
			assert.Equal(t, "yes", s.header.Get("X-Kept"))

			req = httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(edgeChat))
			req.Header[key] = []string{"10.66.66.66:8000"}
			w = httptest.NewRecorder()
			h.ServeHTTP(w, req)
			require.Equal(t, 200, w.Code, "%s", w.Body)
			for k, v := range next {
				if strings.EqualFold(k, key) {
					assert.NotContains(t, v, "10.66.66.66:8000", "passed on by the Middleware")
				}
			}
			e.rec.next(t)
		})
	}
}

// TestProxyRejectsUnforwardableRequests: a request that could not be
// written upstream as it is (a header name that is not a token, a value
// with control characters, a method that is not a token, a query with a
// space or control character) is the client's error: 400 in OpenAI's
// shape, before any endpoint is picked, so nothing is sent and no endpoint
// is marked down. net/http's server refuses these itself; a handler in
// front of the Proxy or the Middleware may not.
func TestProxyRejectsUnforwardableRequests(t *testing.T) {
	addr, got := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e := newEnv(t, Config{}, addr)
	mw, err := NewMiddleware(e.proxy.Table(), Config{})
	require.NoError(t, err)
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the Middleware passed on %s %q", r.Method, r.URL.RawQuery)
	}))
	for _, tc := range []struct {
		name string
		set  func(r *http.Request)
	}{
		{"CRLF in a value", func(r *http.Request) { r.Header["X-A"] = []string{"a\r\nX-Injected: 1"} }},
		{"NUL in a value", func(r *http.Request) { r.Header["X-A"] = []string{"a\x00"} }},
		{"DEL in a value", func(r *http.Request) { r.Header["X-A"] = []string{"a\x7f"} }},
		{"space in a name", func(r *http.Request) { r.Header["X A"] = []string{"a"} }},
		{"empty name", func(r *http.Request) { r.Header[""] = []string{"a"} }},
		{"CRLF in the method", func(r *http.Request) { r.Method = "POST / HTTP/1.1\r\nX-Injected: 1\r\nX-Pad:" }},
		{"empty method", func(r *http.Request) { r.Method = "" }},
		{"CRLF in the query", func(r *http.Request) { r.URL.RawQuery = "a=1 HTTP/1.1\r\nX-Injected: 1" }},
		{"space in the query", func(r *http.Request) { r.URL.RawQuery = "a=1 b" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, via := range []http.Handler{e.proxy, h} {
				req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(edgeChat))
				tc.set(req)
				w := httptest.NewRecorder()
				via.ServeHTTP(w, req)
				assert.Equal(t, http.StatusBadRequest, w.Code, "%s", w.Body)
				var body struct {
					Error struct{ Message, Type, Code string } `json:"error"`
				}
				require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body), "%s", w.Body)
				assert.Equal(t, "invalid_request_error", body.Error.Type)
				assert.Equal(t, "invalid_request", body.Error.Code)
			}
			assert.Empty(t, got, "nothing reached the upstream")
			assert.Zero(t, e.rec.count(), "nothing was picked")
			assert.True(t, e.eps[0].Healthy())
			e.requireIdle(t)
		})
	}
}

// TestProxyGETWithMalformedBodyTakesFallback: the package documents
// that "GET or HEAD requests whatever their body take the fallback route
// ..., never an error"; the Proxy parsed the body (and failed on it)
// before it looked at the method, and answered 400.
func TestProxyGETWithMalformedBodyTakesFallback(t *testing.T) {
	addr, got := backend(t, jsonHandler(200, []byte(`{"ok":true}`), nil))
	e := newEnv(t, Config{}, addr)
	for _, body := range []string{`{"model":`, `{"model":42}`, `{"model":"m"} trailing`, `{"messages":"not an array"}`} {
		t.Run(body, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, e.front.URL+"/v1/chat/completions", strings.NewReader(body))
			require.NoError(t, err)
			r, err := e.front.Client().Do(req)
			require.NoError(t, err)
			b, _ := io.ReadAll(r.Body)
			_ = r.Body.Close()
			if !assert.Equal(t, 200, r.StatusCode, "a GET takes the fallback route whatever its body: got %s", b) {
				return
			}
			<-got
			e.rec.next(t)
		})
	}
}

// TestProxyMalformedResponse: an endpoint that answers with a head that is
// not HTTP is retried on the fallback like a 5xx, reported through Done as
// ErrUpstreamProtocol and not as a connect error, and stays in rotation
// (with its cache generation) until signals.ProtocolErrorThreshold such
// answers came in a row. With no fallback the client gets 502 in OpenAI's
// shape with code upstream_protocol_error.
func TestProxyMalformedResponse(t *testing.T) {
	ok := fixture(t, "openai-api/chat-completions.response.json")
	body := `{"model":"` + baseModel + `","messages":[{"role":"user","content":"hi"}]}`
	for _, raw := range []string{
		"SSH-2.0-OpenSSH_9.6\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
		"HTTP/1.1 200 OK\r\nX-" + strings.Repeat("a", maxResponseHeaderBytes) + ": b\r\n\r\n",
	} {
		name := strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(raw[:min(len(raw), 40)])
		t.Run(name, func(t *testing.T) {
			garbage := rawOnce(t, func(c net.Conn, _ *bufio.Reader, _ *http.Request) { _, _ = io.WriteString(c, raw) })
			good, got := backend(t, jsonHandler(200, ok, nil))
			e := newEnv(t, Config{}, garbage, good)
			served := func() {
				t.Helper()
				select {
				case <-got:
				case <-time.After(10 * time.Second):
					t.Fatal("the fallback got no request")
				}
			}
			gen := e.eps[0].Generation()
			for i := 1; i < signals.ProtocolErrorThreshold; i++ {
				r := e.post(t, "/v1/chat/completions", body, nil)
				b, _ := io.ReadAll(r.Body)
				_ = r.Body.Close()
				require.Equal(t, 200, r.StatusCode, "request %d, served by the fallback: %s", i, b)
				served()
				o := e.rec.next(t)
				assert.Equal(t, "ep0", o.ep)
				assert.ErrorIs(t, o.out.Err, ErrUpstreamProtocol)
				assert.False(t, o.out.ConnectError, "it answered")
				o = e.rec.next(t)
				assert.Equal(t, "ep1", o.ep, "the fallback's Done")
				assert.NoError(t, o.out.Err)
				require.True(t, e.eps[0].Healthy(), "after %d malformed answers", i)
				assert.Equal(t, gen, e.eps[0].Generation(), "its cache is not forgotten")
				e.requireIdle(t)
			}
			r := e.post(t, "/v1/chat/completions", body, nil)
			_ = r.Body.Close()
			require.Equal(t, 200, r.StatusCode)
			served()
			e.rec.next(t)
			e.rec.next(t)
			assert.False(t, e.eps[0].Healthy(), "%d in a row mark it down", signals.ProtocolErrorThreshold)
			assert.True(t, e.eps[1].Healthy())
			e.requireIdle(t)
		})
	}
	t.Run("no fallback", func(t *testing.T) {
		garbage := rawOnce(t, func(c net.Conn, _ *bufio.Reader, _ *http.Request) {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n")
		})
		e := newEnv(t, Config{}, garbage)
		r := e.post(t, "/v1/chat/completions", body, nil)
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		_ = r.Body.Close()
		assert.Equal(t, http.StatusBadGateway, r.StatusCode)
		var eb struct {
			Error struct {
				Message, Type string
				Code          *string
			}
		}
		require.NoError(t, json.Unmarshal(b, &eb), "%s", b)
		require.NotNil(t, eb.Error.Code, "%s", b)
		assert.Equal(t, "upstream_protocol_error", *eb.Error.Code)
		assert.Equal(t, "server_error", eb.Error.Type)
		assert.Contains(t, eb.Error.Message, "malformed response header line")
		o := e.rec.next(t)
		assert.ErrorIs(t, o.out.Err, ErrUpstreamProtocol)
		assert.True(t, e.eps[0].Healthy(), "one bad answer does not take the only endpoint down")
		e.requireIdle(t)
	})
}

// TestProxyRetryTeachesThePrefixIndex: a request that the ranked first
// endpoint turned away (503) and a fallback served leaves its prompt in
// the prefix index on the fallback, where the model server now caches it,
// so that the next request with the prompt goes there although the rank
// still prefers the first. Before retries were accounted by the picker,
// the index knew nothing of the fallback's copy and the next request went
// back to the first endpoint, to prefill the prompt again.
func TestProxyRetryTeachesThePrefixIndex(t *testing.T) {
	var turnedAway atomic.Bool
	first, gotFirst := backend(t, func(w http.ResponseWriter, r *http.Request) {
		if !turnedAway.Swap(true) {
			jsonHandler(503, []byte(`{"error":{}}`), nil)(w, r)
			return
		}
		jsonHandler(200, []byte(`{}`), nil)(w, r)
	})
	second, gotSecond := backend(t, jsonHandler(200, []byte(`{}`), nil))
	ix, err := prefix.NewIndex(prefix.IndexConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ix.Close()) })
	fallbacks := 1
	pk, err := picker.New(picker.Config{
		Scorers:   []picker.Plugin{{Name: "rank", Weight: 1}, {Name: "prefix", Weight: 5}},
		Fallbacks: &fallbacks,
	}, picker.WithRegistry(rankRegistry(t)), picker.WithPrefixMatcher(ix),
		picker.WithLatencyEstimator(signals.NoLatencyEstimator{}))
	require.NoError(t, err)
	eps := []*signals.Endpoint{
		signals.NewEndpoint(signals.EndpointSpec{Name: "first", Address: first, Labels: map[string]string{"rank": "2"}}),
		signals.NewEndpoint(signals.EndpointSpec{Name: "second", Address: second, Labels: map[string]string{"rank": "1"}}),
	}
	pk.SetEndpoints(eps)
	tab, err := NewTable(TableConfig{Pools: []PoolConfig{{Name: "llama", Picker: pk, Models: []string{baseModel}}}})
	require.NoError(t, err)
	px, err := NewProxy(tab, Config{})
	require.NoError(t, err)
	front := httptest.NewServer(px)
	t.Cleanup(front.Close)

	prompt := strings.Repeat("Summarise the quarterly report for the board. ", 40)
	body := `{"model":"` + baseModel + `","messages":[{"role":"user","content":"` + prompt + `"}]}`
	post := func() {
		t.Helper()
		r, err := front.Client().Post(front.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
		require.Equal(t, 200, r.StatusCode)
	}
	post()
	require.Len(t, gotFirst, 1, "the first endpoint turned the request away")
	require.Len(t, gotSecond, 1, "the fallback served it")
	<-gotFirst
	<-gotSecond
	for range 3 {
		post()
	}
	assert.Len(t, gotSecond, 3, "the prompt's next requests go where it is cached")
	assert.Empty(t, gotFirst)
}

// gzipped is s gzip-coded.
func gzipped(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, err := io.WriteString(zw, s)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return b.String()
}

// TestProxyGzipRequestBody: a gzip-coded request body is decoded, routed
// by its model (an alias here, rewritten to the served name) and
// forwarded as plain JSON without Content-Encoding; a body that is not
// the gzip it claims is 400, one that decodes past the limit 413, and
// another coding 415, none forwarded. Before, the coded body could not be
// parsed, so the request went to the fallback route still coded, which a
// model server cannot read.
func TestProxyGzipRequestBody(t *testing.T) {
	addr, got := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e := newEnv(t, Config{MaxBodyBytes: 64 << 10}, addr)
	gz := http.Header{"Content-Encoding": {"gzip"}}
	body := `{"model":"llama","messages":[{"role":"user","content":"` + strings.Repeat("hello ", 100) + `"}]}`

	r := e.post(t, "/v1/chat/completions", gzipped(t, body), gz)
	require.Equal(t, 200, r.StatusCode)
	s := <-got
	assert.Equal(t, strings.Replace(body, `"llama"`, `"`+baseModel+`"`, 1), s.body, "decoded, and routed by its alias")
	assert.Empty(t, s.header.Get("Content-Encoding"))
	assert.Equal(t, strconv.Itoa(len(s.body)), s.header.Get("Content-Length"))
	o := e.rec.next(t)
	assert.Equal(t, baseModel, o.model, "the request's model came from the decoded body")
	assert.Positive(t, o.tokens, "its prompt was read")

	r = e.post(t, "/v1/chat/completions", body, http.Header{"Content-Encoding": {"identity"}})
	require.Equal(t, 200, r.StatusCode)
	s = <-got
	assert.Empty(t, s.header.Get("Content-Encoding"))
	e.rec.next(t)

	requireAPIError(t, e.post(t, "/v1/chat/completions", body, gz), 400, "invalid_request")
	requireAPIError(t, e.post(t, "/v1/chat/completions", gzipped(t, body)[:40], gz), 400, "invalid_request")
	bomb := `{"model":"llama","prompt":"` + strings.Repeat("a", 1<<20) + `"}`
	coded := gzipped(t, bomb)
	require.Less(t, len(coded), 64<<10, "small coded, large decoded")
	requireAPIError(t, e.post(t, "/v1/completions", coded, gz), 413, "request_too_large")
	requireAPIError(t, e.post(t, "/v1/chat/completions", body, http.Header{"Content-Encoding": {"br"}}), 415, "unsupported_content_encoding")
	assert.Empty(t, got, "no refused request was forwarded")
	e.requireIdle(t)
}
