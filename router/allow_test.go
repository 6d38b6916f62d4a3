package router

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tenantAllow is a Config.Allow that reads the client from X-Tenant, as a
// server's authentication would put it in the context: "sql" may use the
// adapter sql-lora only, and no request without a model; "nobody" may use
// nothing; "plain" is refused with an error of no kind the router knows;
// any other client may use everything. It records the routes it was
// asked about.
type tenantAllow struct {
	mu     sync.Mutex
	routes []Route
}

var errNoModel = &APIError{Status: http.StatusForbidden, Type: "invalid_request_error", Param: "model",
	Code: "model_required", Message: "this client must name a model"}

func (a *tenantAllow) allow(r *http.Request, rt Route) error {
	a.mu.Lock()
	a.routes = append(a.routes, rt)
	a.mu.Unlock()
	switch r.Header.Get("X-Tenant") {
	case "sql":
		if rt.Fallback {
			return errNoModel
		}
		if rt.ClientModel != "sql-lora" {
			return fmt.Errorf("%w: %q", ErrModelNotFound, rt.ClientModel)
		}
	case "plain":
		return errors.New("tenant plain is suspended")
	case "nobody":
		if rt.Fallback {
			return errNoModel
		}
		return fmt.Errorf("%w: %q", ErrModelNotFound, rt.ClientModel)
	}
	return nil
}

func (a *tenantAllow) asked() []Route {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Route(nil), a.routes...)
}

// TestProxyAllow: Config.Allow refuses a model the client may not use
// with the very answer an unknown model gets, before any pick (nothing
// is dispatched or forwarded); its *APIError goes out as it is; and the
// listings show each client only what it may use.
func TestProxyAllow(t *testing.T) {
	addr, got := backend(t, jsonHandler(200, []byte(`{"ok":true}`), nil))
	a := &tenantAllow{}
	e := newEnv(t, Config{Allow: a.allow}, addr)
	as := func(tenant string) http.Header { return http.Header{"X-Tenant": {tenant}} }
	body := func(model string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
	}

	t.Run("allowed", func(t *testing.T) {
		r := e.post(t, "/v1/chat/completions", body("sql-lora"), as("sql"))
		assert.Equal(t, 200, r.StatusCode)
		assert.Contains(t, (<-got).body, `"sql-lora"`)
		assert.Equal(t, "sql-lora", e.rec.next(t).adapter)
		asked := a.asked()
		require.NotEmpty(t, asked)
		last := asked[len(asked)-1]
		assert.Equal(t, Route{Pool: last.Pool, ClientModel: "sql-lora", Model: baseModel, Adapter: "sql-lora"}, last,
			"Allow sees the route the table gives")
	})
	t.Run("refused as unknown", func(t *testing.T) {
		before := e.rec.count()
		unknown := e.post(t, "/v1/chat/completions", body("gpt-9"), as("sql"))
		want := requireAPIError(t, unknown, 404, "model_not_found")
		for _, model := range []string{"llama", baseModel} {
			r := e.post(t, "/v1/chat/completions", body(model), as("sql"))
			gotErr := requireAPIError(t, r, 404, "model_not_found")
			assert.Equal(t, strings.Replace(want["message"].(string), "gpt-9", model, 1), gotErr["message"],
				"a model the client may not use is answered as one that does not exist")
			assert.Equal(t, want["param"], gotErr["param"])
			assert.Equal(t, want["type"], gotErr["type"])
		}
		assert.Empty(t, got, "nothing forwarded")
		assert.Equal(t, before, e.rec.count(), "nothing picked")
		e.requireIdle(t)
	})
	t.Run("an APIError as it is", func(t *testing.T) {
		r, err := http.NewRequest(http.MethodGet, e.front.URL+"/health", nil)
		require.NoError(t, err)
		r.Header.Set("X-Tenant", "sql")
		resp, err := e.front.Client().Do(r)
		require.NoError(t, err)
		defer resp.Body.Close()
		ae := requireAPIError(t, resp, 403, "model_required")
		assert.Equal(t, "this client must name a model", ae["message"])
		assert.Equal(t, "model", ae["param"])
		last := a.asked()[len(a.asked())-1]
		assert.True(t, last.Fallback, "a GET asks about the fallback route")
		r2 := e.post(t, "/tokenize", "plain text", as("sql"))
		requireAPIError(t, r2, 403, "model_required")
		assert.Empty(t, got, "nothing forwarded")
	})
	t.Run("another error is a 403", func(t *testing.T) {
		r := e.post(t, "/v1/chat/completions", body("sql-lora"), as("plain"))
		ae := requireAPIError(t, r, 403, "permission_denied")
		assert.Equal(t, "tenant plain is suspended", ae["message"])
		assert.Equal(t, "invalid_request_error", ae["type"])
		assert.Empty(t, got, "nothing forwarded")
	})
	t.Run("listings", func(t *testing.T) {
		list := func(tenant, path string) (int, string) {
			t.Helper()
			r, err := http.NewRequest(http.MethodGet, e.front.URL+path, nil)
			require.NoError(t, err)
			if tenant != "" {
				r.Header.Set("X-Tenant", tenant)
			}
			resp, err := e.front.Client().Do(r)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			return resp.StatusCode, string(b)
		}
		code, all := list("", "/v1/models")
		assert.Equal(t, 200, code)
		assert.Equal(t, string(e.proxy.Table().ModelsJSON()), all, "a client allowed everything gets the table's listing byte for byte")
		_, sql := list("sql", "/v1/models")
		assert.JSONEq(t, `{"object":"list","data":[
			{"id":"sql-lora","object":"model","created":0,"owned_by":"inferroute","root":"sql-lora","parent":"`+baseModel+`"}]}`, sql)
		_, none := list("nobody", "/v1/models")
		assert.JSONEq(t, `{"object":"list","data":[]}`, none)

		code, one := list("sql", "/v1/models/sql-lora")
		assert.Equal(t, 200, code)
		assert.JSONEq(t, `{"id":"sql-lora","object":"model","created":0,"owned_by":"inferroute","root":"sql-lora","parent":"`+baseModel+`"}`, one)
		code, denied := list("sql", "/v1/models/llama")
		assert.Equal(t, 404, code)
		_, unknown := list("sql", "/v1/models/gpt-9")
		assert.Equal(t, strings.Replace(unknown, "gpt-9", "llama", 1), denied, "a model the client may not use is listed as unknown")
		assert.Empty(t, got, "listings are not forwarded")
	})
}

// TestMiddlewareAllow: the Middleware asks Allow as the Proxy does and
// does not call its next handler for a refused request.
func TestMiddlewareAllow(t *testing.T) {
	e := newEnv(t, Config{}, "127.0.0.1:1")
	a := &tenantAllow{}
	m, err := NewMiddleware(e.proxy.Table(), Config{Allow: a.allow, Clock: e.clock})
	require.NoError(t, err)
	called := 0
	h := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		called++
		_, ok := FromContext(r.Context())
		assert.True(t, ok, "an allowed request carries its decision")
	}))
	serve := func(model string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"model":"`+model+`","prompt":"x"}`))
		r.Header.Set("X-Tenant", "sql")
		h.ServeHTTP(w, r)
		return w
	}
	assert.Equal(t, 404, serve("llama").Code)
	assert.Zero(t, called, "a refused request does not reach the next handler")
	assert.Equal(t, 200, serve("sql-lora").Code)
	assert.Equal(t, 1, called)
}

// TestTableModelsAllowed: the filtered listing is the table's own when
// every name is allowed, an empty list when none is, and keeps the
// declaration order.
func TestTableModelsAllowed(t *testing.T) {
	tab, err := NewTable(TableConfig{Pools: []PoolConfig{
		{Name: "a", Picker: newTestPicker(t), Models: []string{"m1", "m2"}, Aliases: map[string]string{"z": "m1"}},
		{Name: "b", Picker: newTestPicker(t), Models: []string{"m3"}},
	}})
	require.NoError(t, err)
	assert.Equal(t, string(tab.ModelsJSON()), string(tab.modelsAllowed(func(Route) bool { return true })))
	assert.Equal(t, `{"object":"list","data":[]}`, string(tab.modelsAllowed(func(Route) bool { return false })))
	var ids []string
	b := tab.modelsAllowed(func(rt Route) bool { return rt.ClientModel != "m2" })
	for _, part := range strings.Split(string(b), `"id":"`)[1:] {
		ids = append(ids, part[:strings.IndexByte(part, '"')])
	}
	assert.Equal(t, []string{"m1", "z", "m3"}, ids)
}
