package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/internal/nettest"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals"
)

// lockedBuffer is a bytes.Buffer that a handler writes while a test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines decodes the JSON lines written so far.
func (l *lockedBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		out = append(out, m)
	}
	return out
}

// nextLine waits for access log line n (0-based); the line is written once
// the response has been answered, which the client may see first.
func (l *lockedBuffer) nextLine(t *testing.T, n int) map[string]any {
	t.Helper()
	var got []map[string]any
	require.Eventually(t, func() bool {
		got = l.lines(t)
		return len(got) > n
	}, 5*time.Second, time.Millisecond)
	require.Len(t, got, n+1, "one line per request")
	return got[n]
}

func TestProxyAccessLog(t *testing.T) {
	ok := fixture(t, "openai-api/chat-completions.response.json")
	var buf lockedBuffer
	accessLog := slog.New(slog.NewJSONHandler(&buf, nil))
	ns := func(d time.Duration) float64 { return float64(d) } // slog's JSON writes a duration in nanoseconds

	t.Run("answered, through an alias", func(t *testing.T) {
		var e *env
		addr, _ := backend(t, jsonHandler(200, ok, func() { e.clock.Advance(250 * time.Millisecond) }))
		e = newEnv(t, Config{AccessLog: accessLog}, addr)
		r := e.post(t, "/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`,
			http.Header{"X-Request-Id": {"req-42"}})
		require.Equal(t, 200, r.StatusCode)
		_, _ = io.Copy(io.Discard, r.Body)
		l := buf.nextLine(t, 0)
		assert.Equal(t, "INFO", l["level"])
		assert.Equal(t, "request", l["msg"])
		assert.Equal(t, "POST", l["method"])
		assert.Equal(t, "/v1/chat/completions", l["path"])
		assert.Equal(t, 200.0, l["status"])
		assert.Equal(t, "req-42", l["request_id"])
		assert.Equal(t, "llama", l["model"], "the model the client named")
		assert.Equal(t, "llama", l["pool"])
		assert.Equal(t, "ep0", l["endpoint"])
		assert.Equal(t, 1.0, l["attempts"])
		assert.Equal(t, false, l["stream"])
		assert.Equal(t, ns(250*time.Millisecond), l["ttft"], "the injected clock's advance before the first byte")
		assert.Equal(t, ns(250*time.Millisecond), l["duration"])
		assert.Equal(t, 8.0, l["prompt_tokens"], "the fixture's usage")
		assert.Equal(t, 377.0, l["completion_tokens"])
		assert.Contains(t, l["client"], "127.0.0.1:")
		assert.NotContains(t, l, "error")
	})

	t.Run("retried on a fallback", func(t *testing.T) {
		bad, _ := backend(t, jsonHandler(503, []byte(`{"error":{"message":"busy","type":"server_error","param":null,"code":null}}`), nil))
		good, _ := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{AccessLog: accessLog}, bad, good)
		r := e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`","messages":[{"role":"user","content":"hi"}]}`, nil)
		require.Equal(t, 200, r.StatusCode)
		_, _ = io.Copy(io.Discard, r.Body)
		l := buf.nextLine(t, 1)
		assert.Equal(t, 200.0, l["status"])
		assert.Equal(t, "ep1", l["endpoint"], "the endpoint that answered")
		assert.Equal(t, 2.0, l["attempts"])
		assert.NotContains(t, l, "error", "the answer succeeded")
	})

	t.Run("refused, and listed", func(t *testing.T) {
		addr, _ := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{AccessLog: accessLog}, addr)
		r := e.post(t, "/v1/chat/completions", `{"model":"gpt-9","messages":[]}`, nil)
		require.Equal(t, 404, r.StatusCode)
		l := buf.nextLine(t, 2)
		assert.Equal(t, 404.0, l["status"])
		assert.Equal(t, "gpt-9", l["model"])
		assert.Contains(t, l["error"], "model not found")
		assert.NotContains(t, l, "endpoint", "nothing was sent")

		resp, err := e.front.Client().Get(e.front.URL + "/v1/models")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		l = buf.nextLine(t, 3)
		assert.Equal(t, "GET", l["method"])
		assert.Equal(t, "/v1/models", l["path"])
		assert.Equal(t, 200.0, l["status"])
	})

	t.Run("a hostile model name is clipped", func(t *testing.T) {
		addr, _ := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{AccessLog: accessLog}, addr)
		long := strings.Repeat("x", 100_000)
		r := e.post(t, "/v1/chat/completions", `{"model":"`+long+`","messages":[]}`, nil)
		require.Equal(t, 404, r.StatusCode)
		e.front.Close()
		l := buf.nextLine(t, 4)
		assert.Equal(t, long[:maxLogValue]+"…", l["model"])
		assert.Len(t, l["error"], maxLogValue+len("…"))
	})

	t.Run("every endpoint down", func(t *testing.T) {
		e := newEnv(t, Config{AccessLog: accessLog}, nettest.RefusedAddr(t), nettest.RefusedAddr(t))
		r := e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`","messages":[{"role":"user","content":"hi"}]}`, nil)
		require.GreaterOrEqual(t, r.StatusCode, 500)
		l := buf.nextLine(t, 5)
		assert.Equal(t, float64(r.StatusCode), l["status"])
		assert.Equal(t, "ep1", l["endpoint"], "the endpoint tried last")
		assert.Equal(t, 2.0, l["attempts"])
		assert.Contains(t, l["error"], "connect", "why it failed")
	})

	t.Run("a stream with its usage", func(t *testing.T) {
		var e *env
		events := sseEvents(fixture(t, "openai-api/chat-completions-stream-include-usage.response.sse"))
		addr, _ := backend(t, sseHandler(events, func() { e.clock.Advance(40 * time.Millisecond) }, nil))
		var own lockedBuffer
		e = newEnv(t, Config{AccessLog: slog.New(slog.NewJSONHandler(&own, nil))}, addr)
		r := e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, nil)
		require.Equal(t, 200, r.StatusCode)
		_, _ = io.Copy(io.Discard, r.Body)
		l := own.nextLine(t, 0)
		assert.Equal(t, true, l["stream"])
		assert.Equal(t, ns(40*time.Millisecond), l["ttft"], "the first event's byte")
		assert.Equal(t, 12.0, l["prompt_tokens"], "the usage chunk at the stream's end")
		assert.Equal(t, 100.0, l["completion_tokens"])
		assert.Equal(t, 0.0, l["cached_tokens"])
	})

	t.Run("a logger off for Info writes nothing", func(t *testing.T) {
		var quiet lockedBuffer
		addr, _ := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{AccessLog: slog.New(slog.NewJSONHandler(&quiet, &slog.HandlerOptions{Level: slog.LevelWarn}))}, addr)
		r := e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`","messages":[{"role":"user","content":"hi"}]}`, nil)
		require.Equal(t, 200, r.StatusCode)
		_, _ = io.Copy(io.Discard, r.Body)
		e.front.Close() // waits for the handler to return
		assert.Empty(t, quiet.lines(t))
	})
}

// TestMiddlewareAccessLog: the Middleware writes the Proxy's line once its
// next handler has returned, naming the last attempt (Decision.Retry's
// included) with the usage the handler reported for it.
func TestMiddlewareAccessLog(t *testing.T) {
	ns := func(d time.Duration) float64 { return float64(d) }
	// serve wraps next in a Middleware logging to its own buffer and
	// sends it one request.
	serve := func(t *testing.T, method, path, body string, next func(*env) http.HandlerFunc) (*http.Response, *lockedBuffer) {
		t.Helper()
		var buf lockedBuffer
		e := newEnv(t, Config{}, "10.0.0.1:8000", "10.0.0.2:8000")
		mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock, RequestID: NewRequestID,
			AccessLog: slog.New(slog.NewJSONHandler(&buf, nil))})
		require.NoError(t, err)
		srv := httptest.NewServer(mw.Wrap(next(e)))
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		r, err := srv.Client().Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, r.Body)
			_ = r.Body.Close()
		}
		srv.Close() // waits for the handler, and so for its line
		return r, &buf
	}
	chat := `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`

	t.Run("answered, with the usage the handler reported", func(t *testing.T) {
		r, buf := serve(t, http.MethodPost, "/v1/chat/completions", chat, func(e *env) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				d, _ := FromContext(r.Context())
				e.clock.Advance(30 * time.Millisecond)
				_, _ = io.WriteString(w, `{"object":"chat.completion"}`)
				d.Done(signals.Outcome{TTFT: 30 * time.Millisecond, PromptTokens: 11, CompletionTokens: 3})
			}
		})
		require.Equal(t, 200, r.StatusCode)
		l := buf.nextLine(t, 0)
		assert.Equal(t, "request", l["msg"])
		assert.Equal(t, "POST", l["method"])
		assert.Equal(t, 200.0, l["status"])
		assert.Equal(t, "llama", l["model"])
		assert.Equal(t, "llama", l["pool"])
		assert.Equal(t, "ep0", l["endpoint"])
		assert.Equal(t, 1.0, l["attempts"])
		assert.Equal(t, ns(30*time.Millisecond), l["ttft"], "the first body byte the Middleware saw")
		assert.Equal(t, ns(30*time.Millisecond), l["duration"])
		assert.Equal(t, 11.0, l["prompt_tokens"])
		assert.Equal(t, 3.0, l["completion_tokens"])
		assert.Equal(t, r.Header.Get("X-Request-Id"), l["request_id"])
		assert.Len(t, l["request_id"], 32)
		assert.NotContains(t, l, "error")
	})

	t.Run("retried on a fallback by the handler", func(t *testing.T) {
		r, buf := serve(t, http.MethodPost, "/v1/chat/completions", chat, func(e *env) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				d, _ := FromContext(r.Context())
				d.Done(signals.Outcome{Err: errors.New("ep0 refused the connection"), ConnectError: true})
				retry := d.Retry(r.Context(), d.Fallbacks[0])
				retry.Done(signals.Outcome{PromptTokens: 5})
				w.WriteHeader(200)
			}
		})
		require.Equal(t, 200, r.StatusCode)
		l := buf.nextLine(t, 0)
		assert.Equal(t, "ep1", l["endpoint"], "the endpoint that answered")
		assert.Equal(t, 2.0, l["attempts"])
		assert.Equal(t, 5.0, l["prompt_tokens"], "the answering attempt's usage")
		assert.NotContains(t, l, "error", "the first attempt's failure was not the answer")
	})

	t.Run("an earlier attempt reported last", func(t *testing.T) {
		_, buf := serve(t, http.MethodPost, "/v1/chat/completions", chat, func(e *env) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				d, _ := FromContext(r.Context())
				d.Done(signals.Outcome{Err: errors.New("ep0: 503")})
				slow := d.Retry(r.Context(), d.Fallbacks[0])
				hedge := d.Retry(r.Context(), d.Endpoint)
				hedge.Done(signals.Outcome{PromptTokens: 4})
				slow.Done(signals.Outcome{Err: context.Canceled}) // the hedge won
				w.WriteHeader(200)
			}
		})
		l := buf.nextLine(t, 0)
		assert.Equal(t, "ep0", l["endpoint"], "the attempt started last")
		assert.Equal(t, 3.0, l["attempts"])
		assert.Equal(t, 4.0, l["prompt_tokens"])
		assert.NotContains(t, l, "error", "the cancelled attempt was not the answer")
	})

	t.Run("a retry not yet reported", func(t *testing.T) {
		var pending picker.Result
		_, buf := serve(t, http.MethodPost, "/v1/chat/completions", chat, func(e *env) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				d, _ := FromContext(r.Context())
				d.Done(signals.Outcome{PromptTokens: 9})
				pending = d.Retry(r.Context(), d.Fallbacks[0])
				w.WriteHeader(200)
			}
		})
		pending.Done(signals.Outcome{}) // after the line was written
		l := buf.nextLine(t, 0)
		assert.Equal(t, "ep1", l["endpoint"])
		assert.NotContains(t, l, "prompt_tokens", "not the first attempt's usage")
	})

	t.Run("an error status", func(t *testing.T) {
		r, buf := serve(t, http.MethodPost, "/v1/chat/completions", chat, func(e *env) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(502)
				_, _ = io.WriteString(w, "bad gateway")
			}
		})
		require.Equal(t, 502, r.StatusCode)
		l := buf.nextLine(t, 0)
		assert.Equal(t, 502.0, l["status"])
		assert.Equal(t, "ep0", l["endpoint"])
		assert.Contains(t, l["error"], "502")
		assert.NotContains(t, l, "ttft", "an error body's first byte is no token's")
	})

	t.Run("a handler that aborts", func(t *testing.T) {
		_, buf := serve(t, http.MethodPost, "/v1/chat/completions", chat, func(e *env) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, "data: {}\n\n")
				panic(http.ErrAbortHandler)
			}
		})
		l := buf.nextLine(t, 0)
		assert.Equal(t, errHandlerAborted.Error(), l["error"])
	})

	t.Run("refused before the handler", func(t *testing.T) {
		r, buf := serve(t, http.MethodPost, "/v1/chat/completions", `{"model":"gpt-9"}`, func(e *env) http.HandlerFunc {
			return func(http.ResponseWriter, *http.Request) { t.Error("handler called") }
		})
		require.Equal(t, 404, r.StatusCode)
		l := buf.nextLine(t, 0)
		assert.Equal(t, 404.0, l["status"])
		assert.Equal(t, "gpt-9", l["model"])
		assert.Contains(t, l["error"], "model not found")
		assert.NotContains(t, l, "endpoint")
	})

	t.Run("a listing", func(t *testing.T) {
		r, buf := serve(t, http.MethodGet, "/v1/models/gpt-9", "", func(e *env) http.HandlerFunc {
			return func(http.ResponseWriter, *http.Request) { t.Error("handler called") }
		})
		require.Equal(t, 404, r.StatusCode)
		l := buf.nextLine(t, 0)
		assert.Equal(t, "GET", l["method"])
		assert.Equal(t, "/v1/models/gpt-9", l["path"])
		assert.Equal(t, 404.0, l["status"])
	})
}
