package router

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals"
)

// completions collects what Config.Completed is handed.
type completions struct {
	mu  sync.Mutex
	got []Completion
}

func (c *completions) add(_ *http.Request, x Completion) {
	c.mu.Lock()
	c.got = append(c.got, x)
	c.mu.Unlock()
}

// last is the one completion seen since the previous call, which fails
// the test when there is not exactly one.
func (c *completions) last(t *testing.T) Completion {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Len(t, c.got, 1)
	x := c.got[0]
	c.got = nil
	return x
}

// TestProxyCompleted: Config.Completed is called once per request the
// Proxy answered, with its route, status, endpoint and the usage the
// answer reported, buffered or streamed; a refused request's has its
// reason and no endpoint; a listing calls nothing.
func TestProxyCompleted(t *testing.T) {
	plain, _ := backend(t, jsonHandler(200, fixture(t, "llm-d-inference-sim/chat-completions.response.json"), nil))
	stream, _ := backend(t, sseHandler(sseEvents(fixture(t, "openai-api/chat-completions-stream-include-usage.response.sse")), nil, nil))
	failing, _ := backend(t, jsonHandler(500, []byte(`{"error":{"message":"boom"}}`), nil))
	var seen completions
	body := `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`

	e := newEnv(t, Config{Completed: seen.add}, plain)
	assert.Equal(t, 200, e.post(t, "/v1/chat/completions", body, nil).StatusCode)
	c := seen.last(t)
	assert.Equal(t, "llama", c.Route.ClientModel)
	assert.Equal(t, baseModel, c.Route.Model)
	assert.Equal(t, 200, c.Status)
	require.NotNil(t, c.Endpoint)
	assert.Equal(t, "ep0", c.Endpoint.Name)
	assert.Equal(t, 1, c.Attempts)
	assert.Equal(t, [3]int{12, 0, 5}, [3]int{c.PromptTokens, c.CachedTokens, c.CompletionTokens}, "the fixture's usage")
	assert.NoError(t, c.Err)

	r := e.post(t, "/v1/chat/completions", `{"model":"gpt-9"}`, nil)
	assert.Equal(t, 404, r.StatusCode)
	c = seen.last(t)
	assert.Equal(t, 404, c.Status)
	assert.Nil(t, c.Route.Pool, "refused before it was routed")
	assert.Nil(t, c.Endpoint)
	assert.Zero(t, c.Attempts)
	assert.ErrorIs(t, c.Err, ErrModelNotFound)

	resp, err := e.front.Client().Get(e.front.URL + "/v1/models")
	require.NoError(t, err)
	_ = resp.Body.Close()
	seen.mu.Lock()
	assert.Empty(t, seen.got, "a listing is not a completion")
	seen.mu.Unlock()

	s := newEnv(t, Config{Completed: seen.add}, stream)
	r = s.post(t, "/v1/chat/completions", `{"model":"llama","stream":true,"stream_options":{"include_usage":true}}`, nil)
	_, err = io.ReadAll(r.Body)
	require.NoError(t, err)
	c = seen.last(t)
	assert.Equal(t, 200, c.Status)
	assert.Equal(t, [2]int{12, 100}, [2]int{c.PromptTokens, c.CompletionTokens}, "the stream's usage chunk")

	f := newEnv(t, Config{Completed: seen.add}, failing, failing)
	assert.Equal(t, 500, f.post(t, "/v1/chat/completions", body, nil).StatusCode)
	c = seen.last(t)
	assert.Equal(t, 500, c.Status)
	assert.Equal(t, 2, c.Attempts, "retried on the fallback")
	assert.ErrorIs(t, c.Err, ErrUpstreamStatus)
	assert.Zero(t, c.PromptTokens)
}

// TestMiddlewareCompleted: the Middleware hands Completed the usage its
// next handler reported through the Decision.
func TestMiddlewareCompleted(t *testing.T) {
	e := newEnv(t, Config{}, "127.0.0.1:1")
	var seen completions
	m, err := NewMiddleware(e.proxy.Table(), Config{Completed: seen.add, Clock: e.clock})
	require.NoError(t, err)
	h := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, ok := FromContext(r.Context())
		require.True(t, ok)
		e.clock.Advance(30 * time.Millisecond)
		w.WriteHeader(201)
		d.Done(signals.Outcome{PromptTokens: 11, CompletionTokens: 4})
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"model":"sql-lora","prompt":"x"}`)))
	require.Equal(t, 201, w.Code)
	c := seen.last(t)
	assert.Equal(t, "sql-lora", c.Route.Adapter)
	assert.Equal(t, 201, c.Status)
	assert.Equal(t, [2]int{11, 4}, [2]int{c.PromptTokens, c.CompletionTokens})
	assert.Equal(t, 30*time.Millisecond, c.Duration)
	assert.Equal(t, 1, c.Attempts)
	assert.False(t, errors.Is(c.Err, ErrUpstreamStatus))
}
