package router

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

func TestMiddleware(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		handler   func(t *testing.T, clock interface{ Advance(time.Duration) }) http.HandlerFunc
		status    int
		wantBody  string
		wantTTFT  time.Duration
		wantErr   bool
		wantUsage int
		// wantWhole: the outcome's Buffered (the body came whole)
		wantWhole bool
		// retried: the handler retried once on the first fallback, whose
		// outcome follows the Decision's
		retried bool
	}{
		{
			name: "handler reports its own outcome",
			body: `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`,
			handler: func(t *testing.T, _ interface{ Advance(time.Duration) }) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					d, ok := FromContext(r.Context())
					require.True(t, ok)
					assert.Equal(t, "ep0", d.Endpoint.Name)
					assert.Equal(t, []string{"ep1"}, names(d.Fallbacks))
					assert.Equal(t, d.Endpoint.Address, r.Header.Get(HeaderDestination), "the next hop is named")
					b, err := io.ReadAll(r.Body)
					require.NoError(t, err)
					assert.Equal(t, `{"model":"`+baseModel+`","messages":[{"role":"user","content":"hi"}]}`, string(b),
						"the body is restored, rewritten to the served name")
					assert.Equal(t, int64(len(b)), r.ContentLength)
					d.Done(signals.Outcome{TTFT: 42 * time.Millisecond, PromptTokens: 11})
					w.WriteHeader(201)
				}
			},
			status: 201, wantTTFT: 42 * time.Millisecond, wantUsage: 11,
		},
		{
			name: "middleware reports when the handler does not",
			body: `{"model":"` + baseModel + `"}`,
			handler: func(t *testing.T, clock interface{ Advance(time.Duration) }) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					d, ok := FromContext(r.Context())
					require.True(t, ok)
					n, _ := d.Endpoint.Prefilling()
					assert.Equal(t, int64(1), n, "prefilling until the first body byte")
					clock.Advance(30 * time.Millisecond)
					w.WriteHeader(502)
					_, _ = io.WriteString(w, "bad gateway")
					n, _ = d.Endpoint.Prefilling()
					assert.Zero(t, n, "the first body byte written ends the prefill (Decision.FirstToken)")
					assert.Equal(t, int64(1), d.Endpoint.InFlight(), "in flight until Done")
				}
			},
			// An error answer's first byte is no token's: no TTFT.
			status: 502, wantBody: "bad gateway", wantTTFT: 0, wantErr: true, wantWhole: true,
		},
		{
			name: "middleware tells a stream from a whole body",
			body: `{"model":"` + baseModel + `","stream":true}`,
			handler: func(t *testing.T, clock interface{ Advance(time.Duration) }) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					clock.Advance(10 * time.Millisecond)
					w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
					_, _ = io.WriteString(w, "data: [DONE]\n\n")
				}
			},
			status: 200, wantBody: "data: [DONE]\n\n", wantTTFT: 10 * time.Millisecond,
		},
		{
			name: "a retry on a fallback is accounted and reported apart",
			body: `{"model":"` + baseModel + `"}`,
			handler: func(t *testing.T, clock interface{ Advance(time.Duration) }) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					d, ok := FromContext(r.Context())
					require.True(t, ok)
					d.Done(signals.Outcome{Err: errors.New("ep0 refused the connection"), ConnectError: true})
					fb := d.Fallbacks[0]
					retry := d.Retry(r.Context(), fb)
					assert.Same(t, fb, retry.Endpoint)
					assert.Equal(t, int64(1), fb.InFlight(), "the retry is in flight on the fallback")
					n, _ := fb.Prefilling()
					assert.Equal(t, int64(1), n, "and prefilling there")
					clock.Advance(7 * time.Millisecond)
					retry.FirstToken()
					retry.Done(signals.Outcome{TTFT: 7 * time.Millisecond, PromptTokens: 5})
					w.WriteHeader(200)
				}
			},
			// The recorder's first outcome is the Decision's: ep0's failure.
			status: 200, wantErr: true, retried: true,
		},
		{
			name: "errors are answered without calling the handler",
			body: `{"model":"nope"}`,
			handler: func(t *testing.T, _ interface{ Advance(time.Duration) }) http.HandlerFunc {
				return func(http.ResponseWriter, *http.Request) { t.Error("handler called") }
			},
			status: 404,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{}, "10.0.0.1:8000", "10.0.0.2:8000")
			mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock, EndpointHeader: HeaderDestination})
			require.NoError(t, err)
			srv := httptest.NewServer(mw.Wrap(tc.handler(t, e.clock)))
			defer srv.Close()
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(tc.body))
			require.NoError(t, err)
			req.Header.Set(HeaderDestination, "6.6.6.6:80")
			r, err := srv.Client().Do(req)
			require.NoError(t, err)
			defer r.Body.Close()
			b, _ := io.ReadAll(r.Body)
			assert.Equal(t, tc.status, r.StatusCode)
			if tc.status == 404 {
				assert.Contains(t, string(b), "model_not_found")
				assert.Zero(t, e.rec.count())
				return
			}
			assert.Equal(t, tc.wantBody, string(b))
			o := e.rec.next(t)
			assert.Equal(t, tc.wantTTFT, o.out.TTFT)
			assert.Equal(t, tc.wantWhole, o.out.Buffered)
			assert.Equal(t, tc.wantUsage, o.out.PromptTokens)
			assert.Equal(t, tc.wantErr, o.out.Err != nil)
			if tc.retried {
				assert.Equal(t, "ep0", o.ep)
				o = e.rec.next(t)
				assert.Equal(t, "ep1", o.ep, "the retry's outcome, from its own Done")
				assert.NoError(t, o.out.Err)
				assert.Equal(t, 7*time.Millisecond, o.out.TTFT)
				assert.Equal(t, 2, e.rec.count(), "one Done per attempt")
				e.requireIdle(t)
				return
			}
			assert.Equal(t, 1, e.rec.count(), "Done once")
			e.requireIdle(t)
		})
	}
}

func names(eps []*signals.Endpoint) []string {
	var out []string
	for _, ep := range eps {
		out = append(out, ep.Name)
	}
	return out
}

// TestMiddlewareReverseProxyStream is the Middleware in the gateway it is
// for: one that owns its proxy, here httputil.ReverseProxy sending each
// request where the Decision says. An SSE stream reaches the client event
// by event through the Middleware's writer, and the outcome it reports
// carries the TTFT and the stream's shape.
func TestMiddlewareReverseProxyStream(t *testing.T) {
	events := sseEvents(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.response.sse"))
	release := make(chan struct{})
	var e *env
	addr, got := backend(t, sseHandler(events, func() { e.clock.Advance(25 * time.Millisecond) }, func(i int) {
		if i == 1 {
			<-release // the second event waits until the client has the first
		}
	}))
	e = newEnv(t, Config{}, addr)
	mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock, EndpointHeader: HeaderDestination})
	require.NoError(t, err)
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		d, ok := FromContext(pr.In.Context())
		require.True(t, ok)
		pr.SetURL(&url.URL{Scheme: "http", Host: d.Endpoint.Address})
	}}
	srv := httptest.NewServer(mw.Wrap(rp))
	defer srv.Close()
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock() // before srv.Close: a failed test must not leave the backend waiting
	// Without a flush per event the first one would never arrive: the
	// client's timeout turns that into a failure instead of a hang.
	client := &http.Client{Timeout: 10 * time.Second}

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"sql-lora","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	req.Header.Set(HeaderDestination, "6.6.6.6:80")
	r, err := client.Do(req)
	require.NoError(t, err)
	defer r.Body.Close()
	require.Equal(t, 200, r.StatusCode)
	br := bufio.NewReader(r.Body)
	assert.Equal(t, events[0], readEvent(t, br), "the first event arrives before the backend sends the second")
	n, _ := e.eps[0].Prefilling()
	assert.Zero(t, n, "the first byte through the Middleware's writer ends the prefill")
	unblock()
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Equal(t, strings.Join(events[1:], ""), string(rest))
	s := <-got
	assert.Equal(t, addr, s.header.Get(HeaderDestination), "the next hop is named, the client's value replaced")

	o := e.rec.next(t)
	assert.NoError(t, o.out.Err)
	assert.Equal(t, 25*time.Millisecond, o.out.TTFT)
	assert.False(t, o.out.Buffered, "an SSE stream is not a whole body")
	assert.Equal(t, 1, e.rec.count(), "Done once")
	e.requireIdle(t)
}

// TestMiddlewareResponseController checks that a handler behind the
// Middleware reaches the connection's controls (a write deadline for a
// long stream) through http.ResponseController.
func TestMiddlewareResponseController(t *testing.T) {
	e := newEnv(t, Config{}, "10.0.0.1:8000")
	mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock})
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		assert.NoError(t, http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Minute)))
		w.WriteHeader(204)
	})))
	defer srv.Close()
	r, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"llama"}`))
	require.NoError(t, err)
	_ = r.Body.Close()
	assert.Equal(t, 204, r.StatusCode)
}

// TestMiddlewareModels: GET /v1/models and /v1/models/{model} are answered
// from the table, without calling the wrapped handler; other GETs reach it.
func TestMiddlewareModels(t *testing.T) {
	e := newEnv(t, Config{}, "10.0.0.1:8000")
	mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock})
	require.NoError(t, err)
	var calls []string
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls = append(calls, r.URL.Path)
		w.WriteHeader(204)
	})))
	defer srv.Close()
	get := func(path string) (int, string) { return getBody(t, srv.Client(), srv.URL+path) }
	code, body := get("/v1/models")
	assert.Equal(t, 200, code)
	assert.Contains(t, body, `"id":"llama"`)
	code, body = get("/v1/models/llama")
	assert.Equal(t, 200, code)
	assert.JSONEq(t, `{"id":"llama","object":"model","created":0,"owned_by":"inferroute","root":"`+baseModel+`","parent":null}`, body)
	code, body = get("/v1/models/gpt-9")
	assert.Equal(t, 404, code)
	assert.Contains(t, body, `"code":"model_not_found"`)
	assert.Empty(t, calls, "answered from the table")
	code, _ = get("/v1/modelsx")
	assert.Equal(t, 204, code)
	assert.Equal(t, []string{"/v1/modelsx"}, calls, "another path reaches the handler")
	e.requireIdle(t)
}

// TestMiddlewareGzipBody: the next handler gets a gzip-coded request's
// decoded body, without the Content-Encoding that no longer describes
// it.
func TestMiddlewareGzipBody(t *testing.T) {
	e := newEnv(t, Config{}, "10.0.0.1:8000")
	mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock})
	require.NoError(t, err)
	body := `{"model":"` + baseModel + `","messages":[{"role":"user","content":"hi"}]}`
	var seenBody, seenCoding string
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seenBody, seenCoding = string(b), r.Header.Get("Content-Encoding")
		w.WriteHeader(200)
	})))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(gzipped(t, body)))
	require.NoError(t, err)
	req.Header.Set("Content-Encoding", "gzip")
	r, err := srv.Client().Do(req)
	require.NoError(t, err)
	_ = r.Body.Close()
	assert.Equal(t, 200, r.StatusCode)
	assert.Equal(t, body, seenBody)
	assert.Empty(t, seenCoding)
	e.rec.next(t)
}

// TestMiddlewarePoolHeader: the next handler gets the request with its
// pool's PoolConfig.Header applied, whatever the case of the client's
// field, in a header it may change without touching the pool's.
func TestMiddlewarePoolHeader(t *testing.T) {
	e := newEnv(t, Config{}, "10.0.0.1:8000")
	tab, err := NewTable(TableConfig{Pools: []PoolConfig{{
		Name: "llama", Picker: e.pk, Models: []string{baseModel},
		Header: http.Header{"Authorization": {"Bearer pool-key"}, "X-Api-Version": {}},
	}}})
	require.NoError(t, err)
	mw, err := NewMiddleware(tab, Config{Clock: e.clock})
	require.NoError(t, err)
	var seen []http.Header
	next := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Header.Clone())
		r.Header["Authorization"][0] = "changed by the handler"
		w.WriteHeader(204)
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A handler in front that set the field under another case.
		r.Header["authorization"] = r.Header["Authorization"]
		delete(r.Header, "Authorization")
		next.ServeHTTP(w, r)
	}))
	defer srv.Close()
	for range 2 {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"`+baseModel+`"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer client-key")
		req.Header.Set("X-Api-Version", "2")
		r, err := srv.Client().Do(req)
		require.NoError(t, err)
		_ = r.Body.Close()
		require.Equal(t, 204, r.StatusCode)
		e.rec.next(t)
	}
	require.Len(t, seen, 2)
	for _, h := range seen {
		assert.Equal(t, []string{"Bearer pool-key"}, h.Values("Authorization"), "the pool's value, the client's gone")
		assert.Empty(t, h.Values("X-Api-Version"))
		assert.Regexp(t, `^1\.1 inferroute-[0-9a-f]{8}$`, h.Get("Via"), "the router's Via, for loops through the next handler")
	}
}
