package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/signals/signalstest"
)

// TestAPIKeyGrants: a key with a grant uses only what it lists, sees only
// that in /v1/models, and is answered for any other model exactly as for
// a model that does not exist; a key without one uses everything; a
// request without a model needs the fallback pool in the grant; a reload
// changes the grants; a grant naming no key is logged, not refused.
func TestAPIKeyGrants(t *testing.T) {
	llamaPod, llamaSeen := headerPod(t, "Authorization")
	embedPod, embedSeen := headerPod(t, "Authorization")
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	const teamA, ops, admin = "sk-team-a-0123456789abcdef", "sk-ops-0123456789abcdef", "sk-admin-0123456789abcdef"
	require.NoError(t, os.WriteFile(keys, []byte("team-a "+teamA+"\nops "+ops+"\nadmin "+admin+"\n"), 0o600))
	config := func(access, grants string) Config {
		t.Helper()
		cfg, err := ParseConfig([]byte(gatewayYAML(llamaPod.Listener.Addr().String()) +
			"  - name: embed\n    models: [e5]\n    endpoints:\n      - {name: pod-e, address: " + embedPod.Listener.Addr().String() + ", engine: vllm}\n" +
			access + "auth:\n  keysFile: " + keys + "\n  grants:\n" + grants))
		require.NoError(t, err)
		return cfg
	}
	var access, logs syncBuf
	g, err := newGateway(config("accessLog: true\n",
		"    team-a: {models: [sql-lora]}\n    ops: {pools: [llama]}\n    ghost: {models: [e5]}\n"),
		slog.New(slog.NewJSONHandler(&logs, nil)), &access)
	require.NoError(t, err)
	startT(t, g)
	assert.Contains(t, logs.String(), `"names":["ghost"]`, "a grant naming no key is a warning")

	serve := func(method, path, key, model string) *httptest.ResponseRecorder {
		t.Helper()
		var body io.Reader
		if model != "" {
			body = strings.NewReader(`{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`)
		}
		r := httptest.NewRequest(method, path, body)
		r.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		g.Handler().ServeHTTP(w, r)
		return w
	}
	chat := func(key, model string) *httptest.ResponseRecorder {
		return serve(http.MethodPost, "/v1/chat/completions", key, model)
	}
	served := func(w *httptest.ResponseRecorder, seen chan []string) {
		t.Helper()
		require.Equal(t, 200, w.Code, w.Body.String())
		<-seen
	}
	// refusedAsUnknown: the answer to a model outside the grant is the
	// answer to a model no pool serves, but for the name.
	refusedAsUnknown := func(key, model string) {
		t.Helper()
		unknown := chat(admin, "gpt-9")
		require.Equal(t, 404, unknown.Code)
		w := chat(key, model)
		require.Equal(t, 404, w.Code, model)
		assert.Equal(t, strings.Replace(unknown.Body.String(), `\"gpt-9\"`, `\"`+model+`\"`, 1), w.Body.String(), model)
		assert.Equal(t, unknown.Header(), w.Header())
		assert.Empty(t, llamaSeen, "not forwarded")
		assert.Empty(t, embedSeen, "not forwarded")
	}
	listed := func(key string) []string { return listedModels(t, g, key) }
	all := []string{base, "sql-lora", "llama", "e5"}

	served(chat(teamA, "sql-lora"), llamaSeen)
	refusedAsUnknown(teamA, "llama")
	refusedAsUnknown(teamA, base)
	refusedAsUnknown(teamA, "e5")
	line := lastAccessLine(t, &access)
	assert.Equal(t, "team-a", line["api_key"])
	assert.Equal(t, 404.0, line["status"])
	assert.Equal(t, []string{"sql-lora"}, listed(teamA))
	assert.Equal(t, 200, serve(http.MethodGet, "/v1/models/sql-lora", teamA, "").Code)
	assert.Equal(t, 404, serve(http.MethodGet, "/v1/models/e5", teamA, "").Code)

	// Without a model: the fallback pool (llama, the first) only with it
	// in the grant.
	w := serve(http.MethodGet, "/health", teamA, "")
	require.Equal(t, 403, w.Code)
	assert.JSONEq(t, `{"error":{"message":"this API key may use only the models granted to it: name one in the request's \"model\" field","type":"invalid_request_error","param":"model","code":"model_required"}}`, w.Body.String())
	assert.Equal(t, 403, serve(http.MethodPost, "/v1/embeddings", teamA, "").Code)
	served(serve(http.MethodGet, "/health", ops, ""), llamaSeen)

	// A pool grant covers every name of the pool, and only those.
	for _, m := range []string{base, "sql-lora", "llama"} {
		served(chat(ops, m), llamaSeen)
	}
	refusedAsUnknown(ops, "e5")
	assert.Equal(t, []string{base, "sql-lora", "llama"}, listed(ops))

	// No grant: everything.
	served(chat(admin, "e5"), embedSeen)
	served(chat(admin, "llama"), llamaSeen)
	assert.Equal(t, all, listed(admin))

	// A reload moves team-a to the embed pool; with the access log off
	// the grant still holds.
	require.NoError(t, g.Reload(config("", "    team-a: {pools: [embed]}\n")))
	served(chat(teamA, "e5"), embedSeen)
	refusedAsUnknown(teamA, "sql-lora")
	assert.Equal(t, []string{"e5"}, listed(teamA))
	served(chat(ops, "e5"), embedSeen) // ops has no grant now
	assert.Equal(t, all, listed(ops))
}

// TestGrantsRejected: a grant that names what no pool has, or grants
// nothing, is refused where the configuration is read, with the field.
func TestGrantsRejected(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(keys, []byte("a sk-0123456789abcdef\n"), 0o600))
	const pools = "pools: [{name: p, models: [m], adapters: {lora: m}, aliases: {alias: lora}}]\n"
	for _, tc := range []struct{ name, grants, want string }{
		{"unknown model", "{a: {models: [m, gpt-9]}}", `auth.grants.a.models: "gpt-9" is no model, adapter or alias of any pool`},
		{"unknown pool", "{a: {pools: [q]}}", `auth.grants.a.pools: "q" is not a pool`},
		{"nothing granted", "{a: {}}", "auth.grants.a: sets nothing (models, pools, requestsPerMinute or tokensPerMinute); to refuse the key, delete it from auth.keysFile"},
		{"a negative token rate", "{a: {tokensPerMinute: -5}}", "auth.grants.a.tokensPerMinute: -5 is negative"},
		{"a negative rate", "{a: {requestsPerMinute: -1}}", "auth.grants.a.requestsPerMinute: -1 is negative"},
		{"a negative burst", "{a: {requestsPerMinute: 60, burst: -1}}", "auth.grants.a.burst: -1 is negative"},
		{"a burst without a rate", "{a: {models: [m], burst: 5}}", "auth.grants.a.burst: needs requestsPerMinute"},
		{"a pool's name as a model", "{a: {models: [p]}}", `"p" is no model, adapter or alias of any pool`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := buildConfig(pools + "auth: {keysFile: " + keys + ", grants: " + tc.grants + "}\n")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	for _, grants := range []string{"{a: {models: [m, lora, alias]}}", "{a: {pools: [p]}}", "{b: {models: [m]}}",
		"{a: {requestsPerMinute: 60}}", "{a: {requestsPerMinute: 60, burst: 100, pools: [p]}}", "{a: {tokensPerMinute: 1000}}"} {
		assert.NoError(t, buildConfig(pools+"auth: {keysFile: "+keys+", grants: "+grants+"}\n"), grants)
	}
}

// TestREADMEGrants: the grants the README shows, with its keys file and
// the shipped gateway.yaml, do what the README says: team-a lists its two
// models and gets the quoted 404 for the Qwen model; ci lists the qwen
// pool's model, and gets the quoted 429 after its burst.
func TestREADMEGrants(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	keysFile := regexp.MustCompile("(?s)```\n(# name key, one per line.*?)```").FindSubmatch(readme)
	require.NotNil(t, keysFile, "the README's keys file")
	block := regexp.MustCompile("(?s)```yaml\n(auth:\n.*?grants:.*?)```").FindSubmatch(readme)
	require.NotNil(t, block, "the README's grants")
	quoted := regexp.MustCompile("`(\\{\"error\":\\{\"message\":\"model not found: [^`]*)`").FindSubmatch(readme)
	require.NotNil(t, quoted, "the README's 404")

	keys := filepath.Join(t.TempDir(), "api-keys")
	require.NoError(t, os.WriteFile(keys, keysFile[1], 0o600))
	shipped, err := os.ReadFile("gateway.yaml")
	require.NoError(t, err)
	auth := strings.Replace(string(block[1]), "/etc/inferroute/api-keys", keys, 1)
	cfg, err := ParseConfig(append(shipped, "\n"+auth...))
	require.NoError(t, err)
	g, err := NewGateway(cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close(context.Background()) })

	key := func(name string) string {
		m := regexp.MustCompile(`(?m)^` + name + ` +(\S+)$`).FindStringSubmatch(string(keysFile[1]))
		require.NotNil(t, m, name)
		return m[1]
	}
	serve := func(r *http.Request, name string) *httptest.ResponseRecorder {
		r.Header.Set("Authorization", "Bearer "+key(name))
		w := httptest.NewRecorder()
		g.Handler().ServeHTTP(w, r)
		return w
	}
	listed := func(name string) []string { return listedModels(t, g, key(name)) }
	assert.ElementsMatch(t, []string{"sql-lora", "llama"}, listed("team-a"))
	assert.Equal(t, []string{"Qwen/Qwen2.5-7B-Instruct"}, listed("ci"))
	w := serve(httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"Qwen/Qwen2.5-7B-Instruct","messages":[]}`)), "team-a")
	require.Equal(t, 404, w.Code)
	var got, want struct{ Error map[string]any }
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got))
	require.NoError(t, json.Unmarshal([]byte(strings.Replace(string(quoted[1]), ",...,", `,"type":"invalid_request_error","param":"model",`, 1)), &want))
	assert.Equal(t, want.Error, got.Error)

	// ci's rate: a burst of 12 (listings count), then the README's 429.
	answer := regexp.MustCompile("(?s)```\nHTTP/1.1 429 Too Many Requests\n(.*?)\n\n([{].*?[}])\n```").FindSubmatch(readme)
	require.NotNil(t, answer, "the README's 429")
	clock := signalstest.NewClock(time.Unix(1_800_000_000, 0))
	g.now = clock.Now
	for i := range 12 {
		require.Equal(t, 200, serve(httptest.NewRequest(http.MethodGet, "/v1/models", nil), "ci").Code, "request %d of the burst", i)
	}
	w = serve(httptest.NewRequest(http.MethodGet, "/v1/models", nil), "ci")
	require.Equal(t, 429, w.Code)
	assert.JSONEq(t, string(answer[2]), w.Body.String())
	for _, field := range strings.Split(string(answer[1]), "\n") {
		k, v, ok := strings.Cut(field, ": ")
		require.True(t, ok, field)
		assert.Equal(t, v, w.Header().Get(k), k)
	}
	clock.Advance(500 * time.Millisecond)
	assert.Equal(t, 200, serve(httptest.NewRequest(http.MethodGet, "/v1/models", nil), "ci").Code, "one every half second")
}
