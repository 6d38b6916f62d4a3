package router

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestMiddlewareReportsAbortedHandlers: a next handler that panics (as
// httputil.ReverseProxy does with http.ErrAbortHandler when the upstream
// body breaks off mid-stream) or whose client went away did not serve the
// request: the Middleware's Done reports an error, not a success.
func TestMiddlewareReportsAbortedHandlers(t *testing.T) {
	t.Run("ReverseProxy aborts a broken stream", func(t *testing.T) {
		// The upstream declares 1000 bytes, sends a few and closes.
		s := newRawServer(t, func(int, *http.Request) (string, bool) {
			return "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\npartial", true
		})
		e := newEnv(t, Config{}, s.addr())
		mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock})
		require.NoError(t, err)
		rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
			d, _ := FromContext(pr.In.Context())
			pr.SetURL(&url.URL{Scheme: "http", Host: d.Endpoint.Address})
		}, ErrorLog: discardLog()}
		srv := httptest.NewServer(mw.Wrap(rp))
		defer srv.Close()
		r, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"llama"}`))
		if err == nil {
			_, rerr := io.ReadAll(r.Body)
			_ = r.Body.Close()
			assert.Error(t, rerr, "the client sees a broken response")
		}
		o := e.rec.next(t)
		assert.Error(t, o.out.Err, "a handler that aborted did not serve the request")
		assert.Equal(t, 1, e.rec.count())
		e.requireIdle(t)
	})
	t.Run("handler panics", func(t *testing.T) {
		e := newEnv(t, Config{}, "10.0.0.1:8000")
		mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock})
		require.NoError(t, err)
		h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"llama"}`))
		func() {
			defer func() { assert.Equal(t, "boom", recover(), "the panic goes on to the server") }()
			h.ServeHTTP(httptest.NewRecorder(), req)
		}()
		o := e.rec.next(t)
		assert.Error(t, o.out.Err)
		assert.Equal(t, 1, e.rec.count())
		e.requireIdle(t)
	})
	t.Run("client went away", func(t *testing.T) {
		e := newEnv(t, Config{}, "10.0.0.1:8000")
		mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			cancel() // the client leaves while the handler waits for the upstream
			<-r.Context().Done()
		}))
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"llama"}`)).WithContext(ctx)
		h.ServeHTTP(httptest.NewRecorder(), req)
		o := e.rec.next(t)
		assert.ErrorIs(t, o.out.Err, context.Canceled)
		e.requireIdle(t)
	})
}

// TestMiddlewareStatusAfterInterim: an interim 1xx response (103 Early
// Hints, which httputil.ReverseProxy forwards) is not the response's
// status: a 5xx after it is still reported as an error.
func TestMiddlewareStatusAfterInterim(t *testing.T) {
	e := newEnv(t, Config{}, "10.0.0.1:8000")
	mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock})
	require.NoError(t, err)
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "overloaded")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	r, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"llama"}`))
	require.NoError(t, err)
	_ = r.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, r.StatusCode)
	o := e.rec.next(t)
	assert.ErrorIs(t, o.out.Err, ErrUpstreamStatus)
	e.requireIdle(t)
}

// discardLog is a log.Logger that drops everything.
func discardLog() *log.Logger { return log.New(io.Discard, "", 0) }

// lateReader is a Config.Transport that answers at once and reads the
// request body only later, in another goroutine, as http.RoundTripper
// allows ("may [close the body] in a separate goroutine even after
// RoundTrip returns") and as net/http.Transport does when a server answers
// before it has read the whole request.
type lateReader struct {
	release chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	got     []string
}

func (l *lateReader) RoundTrip(r *http.Request) (*http.Response, error) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		<-l.release
		b, _ := io.ReadAll(r.Body)
		_ = r.Body.Close()
		l.mu.Lock()
		l.got = append(l.got, string(b))
		l.mu.Unlock()
	}()
	return &http.Response{
		StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader("{}")),
		ContentLength: 2, Request: r,
	}, nil
}

// TestProxyTransportBodyNotReusedBeforeClose: with a Config.Transport, the
// request body handed to RoundTrip stays as it was sent until the transport
// closes it, even after the Proxy has answered and taken the next request.
func TestProxyTransportBodyNotReusedBeforeClose(t *testing.T) {
	lr := &lateReader{release: make(chan struct{})}
	e := newEnv(t, Config{Transport: lr}, "10.0.0.1:8000")
	var sent []string
	for i := range 16 {
		body := fmt.Sprintf(`{"model":"%s","messages":[{"role":"user","content":"request %02d"}]}`, baseModel, i)
		sent = append(sent, body)
		w := httptest.NewRecorder()
		e.proxy.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
		require.Equal(t, 200, w.Code)
		e.rec.next(t)
	}
	close(lr.release)
	lr.wg.Wait()
	assert.ElementsMatch(t, sent, lr.got, "each request's body as it was sent")
}

// TestProxy5xxRelayedWhenNoFallbackLeft: a 5xx is retried only when a
// fallback is left to try. When the only fallback was marked down since the
// pick (and is skipped), the client gets the endpoint's own answer, as it
// does when the pick has no fallback, not a 502 saying that no model server
// could be reached.
func TestProxy5xxRelayedWhenNoFallbackLeft(t *testing.T) {
	overloaded := `{"error":{"message":"engine overloaded","type":"server_error","param":null,"code":"overloaded"}}`
	var e *env
	bad, gotBad := backend(t, func(w http.ResponseWriter, r *http.Request) {
		e.eps[1].MarkDown() // another request's connect error, while ep0 answers
		w.Header().Set("Retry-After", "3")
		jsonHandler(503, []byte(overloaded), nil)(w, r)
	})
	skipped, gotSkipped := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e = newEnv(t, Config{}, bad, skipped)
	r := e.post(t, "/v1/chat/completions", `{"model":"llama"}`, nil)
	b, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	assert.Equal(t, 503, r.StatusCode)
	assert.Equal(t, "3", r.Header.Get("Retry-After"))
	assert.Equal(t, overloaded, string(b))
	<-gotBad
	assert.Empty(t, gotSkipped, "no traffic to an endpoint marked down")
	o := e.rec.next(t)
	assert.Equal(t, "ep0", o.ep)
	assert.ErrorIs(t, o.out.Err, ErrUpstreamStatus)
	assert.Equal(t, 1, e.rec.count(), "one Done per pick")
	e.requireIdle(t)
}

// TestProxyNoRetryForAClientGone: a client that went away while the pick
// answered 5xx is not served by a fallback: no request is sent there, even
// on an idle keep-alive connection, which the built-in client would
// otherwise write to without waiting for its context check.
func TestProxyNoRetryForAClientGone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bad, gotBad := backend(t, func(w http.ResponseWriter, r *http.Request) {
		cancel() // the client leaves while the pick answers 503
		jsonHandler(503, []byte(`{}`), nil)(w, r)
	})
	fallback, gotFallback := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e := newEnv(t, Config{}, bad, fallback)
	body := `{"model":"llama"}`

	// Warm a keep-alive connection to the fallback: one request while the
	// pick is down.
	e.eps[0].MarkDown()
	w := httptest.NewRecorder()
	e.proxy.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
	require.Equal(t, 200, w.Code)
	<-gotFallback
	e.rec.next(t)
	e.eps[0].ReportSuccess(e.eps[0].HealthMark())
	require.True(t, e.eps[0].Healthy())

	w = httptest.NewRecorder()
	e.proxy.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)).WithContext(ctx))
	<-gotBad
	o := e.rec.next(t)
	assert.Equal(t, "ep0", o.ep)
	assert.Empty(t, gotFallback, "no request to a fallback for a client that is gone")
	assert.Equal(t, 2, e.rec.count(), "no Done for an attempt not made")
	e.requireIdle(t)
}

// TestProxyMetricsCountAbortedResponses: a response aborted because its
// body broke off after bytes were sent is counted in the request metrics,
// as every other request is.
func TestProxyMetricsCountAbortedResponses(t *testing.T) {
	s := newRawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n0123456789", true
	})
	reader := sdkmetric.NewManualReader()
	e := newEnv(t, Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}, s.addr())
	req, err := http.NewRequest(http.MethodPost, e.front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"llama"}`))
	require.NoError(t, err)
	if resp, err := e.front.Client().Do(req); err == nil {
		_, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
	}
	e.rec.next(t) // Done comes before the abort, and the metrics before the handler returns
	e.front.Close()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var requests int64
	var durations uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case "inferroute.router.requests":
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					requests += dp.Value
				}
			case "inferroute.router.request.duration":
				for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
					durations += dp.Count
				}
			}
		}
	}
	assert.Equal(t, int64(1), requests, "the aborted request is counted")
	assert.Equal(t, uint64(1), durations, "and its duration recorded")
}

// slowBody is a request body whose upload takes d on the injected clock.
type slowBody struct {
	r     io.Reader
	clock interface{ Advance(time.Duration) }
	d     time.Duration
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.d > 0 {
		b.clock.Advance(b.d)
		b.d = 0
	}
	return b.r.Read(p)
}

// TestMiddlewareTimesFromDispatch: the Middleware's outcome measures TTFT
// and latency from dispatch (signals.Outcome), as the Proxy does, not from
// the request's arrival: a client that takes a second to upload its prompt
// does not make the endpoint look a second slower.
func TestMiddlewareTimesFromDispatch(t *testing.T) {
	e := newEnv(t, Config{}, "10.0.0.1:8000")
	mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock})
	require.NoError(t, err)
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.clock.Advance(30 * time.Millisecond) // prefill
		_, _ = io.WriteString(w, "{}")
		e.clock.Advance(20 * time.Millisecond) // the rest of the body
	}))
	body := &slowBody{r: strings.NewReader(`{"model":"llama"}`), clock: e.clock, d: time.Second}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/chat/completions", body))
	o := e.rec.next(t)
	require.NoError(t, o.out.Err)
	assert.Equal(t, 30*time.Millisecond, o.out.TTFT)
	assert.Equal(t, 50*time.Millisecond, o.out.Latency)
}

// TestProxyDoesNotPoolOutsizedStreamBuffers: the line and rewrite buffers
// an SSE stream with a huge event (a streamed image's base64, say) grew
// are not kept in the call pool, as outsized body buffers are not.
func TestProxyDoesNotPoolOutsizedStreamBuffers(t *testing.T) {
	// The call released is the one taken next: one P (sync.Pool keeps a
	// call per P), and no collection to empty the pool in between.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	big := strings.Repeat("A", 4*DefaultMaxBodyBytes+1)
	addr, _ := backend(t, sseHandler([]string{
		`data: {"model":"` + baseModel + `","choices":[{"delta":{"content":"` + big + `"}}]}` + "\n\n",
		"data: [DONE]\n\n",
	}, nil, nil))
	e := newEnv(t, Config{MaxResponseBuffer: 8 * DefaultMaxBodyBytes}, addr) // the line is held whole
	w := httptest.NewRecorder()
	e.proxy.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"llama","stream":true}`))) // an alias: the chunk is rewritten
	require.Equal(t, 200, w.Code)
	require.Contains(t, w.Body.String(), big)
	e.rec.next(t)
	c := e.proxy.getCall() // the call just released, when the pool kept it
	assert.LessOrEqual(t, cap(c.line), 4*DefaultMaxBodyBytes)
	assert.LessOrEqual(t, cap(c.out), 4*DefaultMaxBodyBytes)
}

// TestUnusedHostsLeaveTheClient: the built-in client keeps a pool per
// upstream address; an address whose idle connections have all expired,
// with none in use, or that cannot be reached at all, leaves the client's
// map, so that a gateway in front of a churning fleet does not keep every
// address it ever had. A host with a connection in use stays.
func TestUnusedHostsLeaveTheClient(t *testing.T) {
	const raw = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	cl := newH1Client()
	cl.idleTimeout = 20 * time.Millisecond
	hosts := func() int {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		return len(cl.hosts)
	}
	// Idle connections that have not expired keep their hosts: with an
	// hour's timeout, all three stay however slow the machine.
	keep := newH1Client()
	keep.idleTimeout = time.Hour
	for range 3 {
		s := newRawServer(t, func(int, *http.Request) (string, bool) { return raw, false })
		resp, err := keep.do(context.Background(), postTo(s.addr(), "{}"))
		require.NoError(t, err)
		assert.Equal(t, "ok", readAll(t, resp))
	}
	keep.mu.Lock()
	assert.Len(t, keep.hosts, 3, "hosts with idle connections left the map")
	keep.mu.Unlock()

	// Expired ones leave. Each host is checked while its response is
	// unread, its connection in use, which keeps it whatever the timing:
	// the 20 ms idle timeout can pass before the next request on a busy
	// machine.
	for range 3 {
		s := newRawServer(t, func(int, *http.Request) (string, bool) { return raw, false })
		resp, err := cl.do(context.Background(), postTo(s.addr(), "{}"))
		require.NoError(t, err)
		cl.mu.Lock()
		_, ok := cl.hosts[s.addr()]
		cl.mu.Unlock()
		assert.True(t, ok, "a host with a connection in use is not in the map")
		assert.Equal(t, "ok", readAll(t, resp))
	}
	require.Eventually(t, func() bool { return hosts() == 0 }, 5*time.Second, 5*time.Millisecond,
		"hosts whose idle connections expired stay in the map")

	// A connection in use keeps its host.
	s := newRawServer(t, func(int, *http.Request) (string, bool) { return raw, false })
	warm, err := cl.do(context.Background(), postTo(s.addr(), "{}"))
	require.NoError(t, err)
	assert.Equal(t, "ok", readAll(t, warm)) // back in the pool, timer armed
	busy, err := cl.do(context.Background(), postTo(s.addr(), "{}"))
	require.NoError(t, err) // the idle connection, now in use
	second, err := cl.do(context.Background(), postTo(s.addr(), "{}"))
	require.NoError(t, err) // a second connection
	assert.Equal(t, "ok", readAll(t, second))
	cl.mu.Lock()
	h := cl.hosts[s.addr()]
	cl.mu.Unlock()
	require.NotNil(t, h)
	require.Eventually(t, func() bool { // the second's idle connection expires
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.idle) == 0 && h.timer == nil
	}, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, hosts(), "a host with a connection in use left the map")
	assert.Equal(t, "ok", readAll(t, busy))
	require.Eventually(t, func() bool { return hosts() == 0 }, 5*time.Second, 5*time.Millisecond)

	// An address nobody listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	_, err = cl.do(context.Background(), postTo(dead, "{}"))
	require.Error(t, err)
	assert.Zero(t, hosts(), "an unreachable address kept its host")
}

// TestProxyRelaysAnSSELineOverTheBufferUnchanged: an SSE line longer than
// MaxResponseBuffer is relayed as it comes, unchanged (not rewritten, its
// usage not read), instead of being held whole however long the upstream
// makes it; the lines after it are handled as usual.
func TestProxyRelaysAnSSELineOverTheBufferUnchanged(t *testing.T) {
	// As in TestProxyDoesNotPoolOutsizedStreamBuffers: the call released
	// is the one taken next, to look at its line buffer.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	const limit = 64 << 10
	big := strings.Repeat("A", 4*limit)
	long := `data: {"model":"` + baseModel + `","choices":[{"delta":{"content":"` + big + `"}}]}` + "\n"
	short := `data: {"model":"` + baseModel + `","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}` + "\n\n"
	addr, _ := backend(t, sseHandler([]string{long + "\n", short, "data: [DONE]\n\n"}, nil, nil))
	e := newEnv(t, Config{MaxResponseBuffer: limit}, addr)
	w := httptest.NewRecorder()
	e.proxy.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"llama","stream":true}`))) // an alias: short lines are rewritten
	require.Equal(t, 200, w.Code)
	body := w.Body.String()
	assert.True(t, strings.HasPrefix(body, long), "the long line is relayed unchanged")
	assert.Contains(t, body, `data: {"model":"llama","choices":[],"usage"`, "the next line is rewritten")
	assert.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"))
	assert.NotContains(t, body, "upstream_stream_error")
	o := e.rec.next(t)
	require.NoError(t, o.out.Err)
	assert.Equal(t, 3, o.out.CompletionTokens, "the usage after the long line is read")
	c := e.proxy.getCall()
	assert.Less(t, cap(c.line), 2*limit, "the long line was held whole")
}

// TestProxyCutsAStreamIdleOverTheTimeout: with Config.StreamIdleTimeout an
// SSE stream that sends nothing for that long (a server whose engine hung
// behind a live HTTP server) is cut: the client gets what came and the
// stream's error event, Done gets ErrStreamIdle wrapped in
// ErrStreamBroken. A stream whose lines keep coming, each within the
// timeout, runs to its end however long it lasts.
func TestProxyCutsAStreamIdleOverTheTimeout(t *testing.T) {
	const idle = 200 * time.Millisecond
	chunk := `data: {"model":"` + baseModel + `","choices":[{"delta":{"content":"hi"}}]}` + "\n\n"
	hang := make(chan struct{})
	addr, _ := backend(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, chunk)
		w.(http.Flusher).Flush()
		select { // the engine hangs; the HTTP server stays up
		case <-hang:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(hang) }) // before the backend's Close, which waits for the handler
	e := newEnv(t, Config{StreamIdleTimeout: idle}, addr)
	w := httptest.NewRecorder()
	served := make(chan struct{})
	go func() {
		defer close(served)
		e.proxy.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
			strings.NewReader(`{"model":"`+baseModel+`","stream":true}`)))
	}()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("a stream idle for 10 s was not cut")
	}
	body := w.Body.String()
	assert.True(t, strings.HasPrefix(body, chunk), "what came before the stall reaches the client")
	assert.Contains(t, body, "upstream_stream_error")
	assert.Contains(t, body, "idle")
	o := e.rec.next(t)
	assert.ErrorIs(t, o.out.Err, ErrStreamIdle)
	assert.ErrorIs(t, o.out.Err, ErrStreamBroken)

	// Lines every 20 ms for 200 ms: never idle for anything near 200 ms.
	events := make([]string, 10)
	for i := range events {
		events[i] = chunk
	}
	events = append(events, "data: [DONE]\n\n")
	addr2, _ := backend(t, sseHandler(events, nil, func(int) { time.Sleep(idle / 10) }))
	e2 := newEnv(t, Config{StreamIdleTimeout: idle}, addr2)
	w2 := httptest.NewRecorder()
	e2.proxy.ServeHTTP(w2, httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"`+baseModel+`","stream":true}`)))
	assert.NotContains(t, w2.Body.String(), "upstream_stream_error")
	assert.True(t, strings.HasSuffix(w2.Body.String(), "data: [DONE]\n\n"))
	require.NoError(t, e2.rec.next(t).out.Err)
}
