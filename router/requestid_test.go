package router

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// counter returns a Config.RequestID that makes "gen-1", "gen-2", ... and
// how many it made.
func counter() (func() string, *atomic.Int64) {
	var n atomic.Int64
	return func() string { return "gen-" + strconv.FormatInt(n.Add(1), 10) }, &n
}

func TestProxyRequestID(t *testing.T) {
	ok := fixture(t, "openai-api/chat-completions.response.json")
	chat := `{"model":"` + baseModel + `","messages":[{"role":"user","content":"hi"}]}`

	t.Run("made for a request without one", func(t *testing.T) {
		gen, n := counter()
		addr, got := backend(t, jsonHandler(200, ok, nil))
		var access lockedBuffer
		e := newEnv(t, Config{RequestID: gen, AccessLog: slog.New(slog.NewJSONHandler(&access, nil))}, addr)
		r := e.post(t, "/v1/chat/completions", chat, nil)
		require.Equal(t, 200, r.StatusCode)
		assert.Equal(t, []string{"gen-1"}, (<-got).header.Values("X-Request-Id"), "the model server gets it")
		assert.Equal(t, "gen-1", r.Header.Get("X-Request-Id"), "the client gets it back")
		assert.Equal(t, "gen-1", access.nextLine(t, 0)["request_id"], "and the access log")
		assert.Equal(t, int64(1), n.Load())
	})

	t.Run("the client's is kept and echoed", func(t *testing.T) {
		gen, n := counter()
		addr, got := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{RequestID: gen}, addr)
		r := e.post(t, "/v1/chat/completions", chat, http.Header{"X-Request-Id": {"client-7"}})
		require.Equal(t, 200, r.StatusCode)
		assert.Equal(t, "client-7", (<-got).header.Get("X-Request-Id"))
		assert.Equal(t, "client-7", r.Header.Get("X-Request-Id"))
		assert.Zero(t, n.Load(), "none made")
	})

	t.Run("the model server's own wins in the response", func(t *testing.T) {
		gen, _ := counter()
		addr, got := backend(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Request-Id", "vllm-"+r.Header.Get("X-Request-Id"))
			jsonHandler(200, ok, nil)(w, r)
		})
		e := newEnv(t, Config{RequestID: gen}, addr)
		r := e.post(t, "/v1/chat/completions", chat, nil)
		require.Equal(t, 200, r.StatusCode)
		<-got
		assert.Equal(t, []string{"vllm-gen-1"}, r.Header.Values("X-Request-Id"), "one value, the server's")
	})

	t.Run("a refused request has one too", func(t *testing.T) {
		gen, _ := counter()
		addr, _ := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{RequestID: gen}, addr)
		r := e.post(t, "/v1/chat/completions", `{"model":"gpt-9","messages":[]}`, nil)
		require.Equal(t, 404, r.StatusCode)
		assert.Equal(t, "gen-1", r.Header.Get("X-Request-Id"), "the id to quote when asking why")
	})

	t.Run("a generator's bad id is not sent", func(t *testing.T) {
		addr, got := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{RequestID: func() string { return "x\r\nX-Injected: 1" }}, addr)
		r := e.post(t, "/v1/chat/completions", chat, nil)
		require.Equal(t, 200, r.StatusCode)
		h := (<-got).header
		assert.Empty(t, h.Values("X-Request-Id"))
		assert.Empty(t, h.Values("X-Injected"), "no header smuggled into the upstream request")
		assert.Empty(t, r.Header.Values("X-Request-Id"))
	})

	t.Run("a listing has one", func(t *testing.T) {
		gen, _ := counter()
		addr, _ := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{RequestID: gen}, addr)
		for _, tc := range []struct{ path, sent, want string }{
			{"/v1/models", "", "gen-1"},
			{"/v1/models/llama", "client-3", "client-3"},
			{"/v1/models/gpt-9", "", "gen-2"}, // a 404 too
		} {
			req, err := http.NewRequest(http.MethodGet, e.front.URL+tc.path, nil)
			require.NoError(t, err)
			if tc.sent != "" {
				req.Header.Set("X-Request-Id", tc.sent)
			}
			r, err := e.front.Client().Do(req)
			require.NoError(t, err)
			_ = r.Body.Close()
			assert.Equal(t, tc.want, r.Header.Get("X-Request-Id"), tc.path)
		}
	})

	t.Run("off, none is made", func(t *testing.T) {
		addr, got := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{}, addr)
		r := e.post(t, "/v1/chat/completions", chat, nil)
		require.Equal(t, 200, r.StatusCode)
		assert.Empty(t, (<-got).header.Values("X-Request-Id"))
		assert.Empty(t, r.Header.Values("X-Request-Id"))
	})

	t.Run("the middleware hands it on", func(t *testing.T) {
		gen, _ := counter()
		addr, _ := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{}, addr)
		mw, err := NewMiddleware(e.proxy.Table(), Config{Clock: e.clock, RequestID: gen})
		require.NoError(t, err)
		var seen string
		h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen = r.Header.Get("X-Request-Id")
			w.WriteHeader(200)
		}))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chat)))
		require.Equal(t, 200, w.Code)
		assert.Equal(t, "gen-1", seen, "the next handler's request carries it")
		assert.Equal(t, "gen-1", w.Header().Get("X-Request-Id"))
	})
}

func TestNewRequestID(t *testing.T) {
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := NewRequestID()
		require.Regexp(t, hex32, id)
		require.False(t, seen[id], "repeated: %s", id)
		seen[id] = true
	}
}

func BenchmarkNewRequestID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = NewRequestID()
	}
}
