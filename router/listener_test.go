package router

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRawListenerServesTheProxy serves the Proxy on a RawListener: a
// 300 KB prompt reaches the model server whole, a stream's first event
// reaches the client before the model server sends the second, and on
// Linux the server's connections are the raw ones.
func TestRawListenerServesTheProxy(t *testing.T) {
	events := sseEvents(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.response.sse"))
	release := make(chan struct{})
	addr, got := backend(t, func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept"), "event-stream") {
			jsonHandler(200, fixture(t, "openai-api/chat-completions.response.json"), nil)(w, r)
			return
		}
		sseHandler(events, nil, func(i int) {
			if i == 1 {
				<-release
			}
		})(w, r)
	})
	e := newEnv(t, Config{}, addr)

	var mu sync.Mutex
	var conns []net.Conn
	srv := httptest.NewUnstartedServer(e.proxy)
	srv.Listener = RawListener(srv.Listener)
	srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		return ctx
	}
	srv.Start()
	t.Cleanup(srv.Close)

	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 300<<10/45)
	body := `{"model":"` + baseModel + `","messages":[{"role":"user","content":"` + prompt + `"}]}`
	r, err := srv.Client().Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	b, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	_ = r.Body.Close()
	require.Equal(t, 200, r.StatusCode, "%s", b)
	assert.JSONEq(t, string(fixture(t, "openai-api/chat-completions.response.json")), string(b))
	assert.Equal(t, body, (<-got).body, "the model server got the prompt whole")

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions",
		strings.NewReader(string(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.request.json"))))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	r, err = srv.Client().Do(req)
	require.NoError(t, err)
	defer r.Body.Close()
	require.Equal(t, 200, r.StatusCode)
	br := bufio.NewReader(r.Body)
	assert.Equal(t, events[0], readEvent(t, br), "the first event arrives before the model server sends the second")
	close(release)
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Equal(t, strings.Join(events[1:], ""), string(rest))
	<-got

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, conns)
	for _, c := range conns {
		requireRaw(t, c)
	}
}
