package router

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		e := newEnv(t, Config{AccessLog: accessLog}, deadAddr(t), deadAddr(t))
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
