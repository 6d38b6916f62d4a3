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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAPIKeys: with auth on, a request the proxy serves needs one of the
// keys file's keys as a Bearer credential, or gets OpenAI's 401; the
// model servers get the pool's credential, never the client's; probes and
// /metrics stay open; a reload revokes and adds keys, or turns them off.
func TestAPIKeys(t *testing.T) {
	pod, seen := headerPod(t, "Authorization")

	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	const teamA, lone, teamB = "sk-team-a-0123456789abcdef", "sk-lone-0123456789abcdef", "sk-team-b-0123456789abcdef"
	keys := write("keys", "# clients\nteam-a "+teamA+"\n\n  "+lone+"  \n")
	upstream := write("vllm-key", "vllm-secret-0123456789\n")
	config := func(auth, pool string) Config {
		cfg, err := ParseConfig([]byte(gatewayYAML(pod.Listener.Addr().String()) + pool + "accessLog: true\n" + auth))
		require.NoError(t, err)
		return cfg
	}
	withUpstreamKey := "    upstreamKeyFile: " + upstream + "\n"
	authOn := "auth: {keysFile: " + keys + "}\n"

	var access syncBuf
	g, err := newGateway(config(authOn, withUpstreamKey), slog.New(slog.DiscardHandler), &access)
	require.NoError(t, err)
	startT(t, g)
	serve := func(method, path, authorization string) *httptest.ResponseRecorder {
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`)
		}
		r := httptest.NewRequest(method, path, body)
		if authorization != "" {
			r.Header.Set("Authorization", authorization)
		}
		w := httptest.NewRecorder()
		g.Handler().ServeHTTP(w, r)
		return w
	}
	lastLine := func() map[string]any { return lastAccessLine(t, &access) }
	refused := func(w *httptest.ResponseRecorder, message string) {
		t.Helper()
		require.Equal(t, http.StatusUnauthorized, w.Code, w.Body.String())
		assert.JSONEq(t, `{"error":{"message":`+strconvQuote(message)+`,"type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`, w.Body.String())
		assert.Equal(t, `Bearer realm="inferroute"`, w.Header().Get("WWW-Authenticate"))
		assert.Empty(t, seen, "not forwarded")
		l := lastLine()
		assert.Equal(t, 401.0, l["status"])
		assert.Equal(t, message, l["error"])
		assert.NotContains(t, l, "api_key")
	}
	const missing = `no API key: send one in the Authorization header as "Bearer <key>"`

	refused(serve(http.MethodPost, "/v1/chat/completions", ""), missing)
	refused(serve(http.MethodPost, "/v1/chat/completions", "Basic dGVhbS1hOg=="), missing)
	refused(serve(http.MethodPost, "/v1/chat/completions", "Bearer sk-guess-0123456789abcdef"), "invalid API key")
	refused(serve(http.MethodGet, "/v1/models", ""), missing)

	w := serve(http.MethodPost, "/v1/chat/completions", "Bearer "+teamA)
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.Equal(t, []string{"Bearer vllm-secret-0123456789"}, <-seen, "the pool's credential, not the client's")
	l := lastLine()
	assert.Equal(t, 200.0, l["status"])
	assert.Equal(t, "team-a", l["api_key"], "the key's name, never the key")
	assert.NotContains(t, access.String(), teamA)

	w = serve(http.MethodPost, "/v1/chat/completions", "bearer  "+lone) // the scheme in any case
	require.Equal(t, 200, w.Code, w.Body.String())
	<-seen
	assert.Equal(t, "line 4", lastLine()["api_key"])
	assert.Equal(t, 200, serve(http.MethodGet, "/v1/models", "Bearer "+lone).Code)

	for _, path := range []string{"/livez", "/metrics"} {
		assert.Equal(t, 200, serve(http.MethodGet, path, "").Code, path+" is open")
	}
	metrics := serve(http.MethodGet, "/metrics", "").Body.String()
	assert.Regexp(t, `inferroute_gateway_unauthorized_total\{[^}]*reason="missing"[^}]*\} 3\n`, metrics)
	assert.Regexp(t, `inferroute_gateway_unauthorized_total\{[^}]*reason="invalid"[^}]*\} 1\n`, metrics)

	// A reload that cannot read the keys changes nothing.
	bad := config("auth: {keysFile: "+filepath.Join(dir, "absent")+"}\n", withUpstreamKey)
	require.ErrorContains(t, g.Reload(bad), "auth.keysFile")
	require.Equal(t, 200, serve(http.MethodPost, "/v1/chat/completions", "Bearer "+teamA).Code)
	assert.Equal(t, []string{"Bearer vllm-secret-0123456789"}, <-seen)

	// Revoke team-a, add team-b, and drop the pool's credential: the
	// client's key still stays at the gateway.
	write("keys", "team-b "+teamB+"\n")
	require.NoError(t, g.Reload(config(authOn, "")))
	refused(serve(http.MethodPost, "/v1/chat/completions", "Bearer "+teamA), "invalid API key")
	require.Equal(t, 200, serve(http.MethodPost, "/v1/chat/completions", "Bearer "+teamB).Code)
	assert.Empty(t, <-seen, "no Authorization reaches the pod")
	assert.Equal(t, "team-b", lastLine()["api_key"])

	// Keys off: anyone may call, and the client's header passes.
	require.NoError(t, g.Reload(config("", "")))
	require.Equal(t, 200, serve(http.MethodPost, "/v1/chat/completions", "").Code)
	assert.Empty(t, <-seen)
	require.Equal(t, 200, serve(http.MethodPost, "/v1/chat/completions", "Bearer client-own").Code)
	assert.Equal(t, []string{"Bearer client-own"}, <-seen)
	assert.NotContains(t, lastLine(), "api_key")
}

// startT starts g and stops it when the test ends.
func startT(t *testing.T, g *Gateway) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, g.Start(ctx))
	t.Cleanup(func() {
		cancel()
		_ = g.Close(context.Background())
	})
}

// lastAccessLine is the last line of an access log, decoded.
func lastAccessLine(t *testing.T, access *syncBuf) map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(access.String()), "\n")
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &m))
	return m
}

// listedModels is the ids of g's /v1/models as the API key key sees it.
func listedModels(t *testing.T, g *Gateway, key string) []string {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
	r.Header.Set("Authorization", "Bearer "+key)
	w := httptest.NewRecorder()
	g.Handler().ServeHTTP(w, r)
	require.Equal(t, 200, w.Code, w.Body.String())
	var l struct{ Data []struct{ ID string } }
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &l))
	ids := []string{}
	for _, d := range l.Data {
		ids = append(ids, d.ID)
	}
	return ids
}

// headerPod is a model server answering chat completions and /metrics
// with llm-d-inference-sim captures, which sends on the channel the
// values of the header named key each completion request came with.
func headerPod(t *testing.T, key string) (*httptest.Server, chan []string) {
	t.Helper()
	chat := fixture(t, "openai/llm-d-inference-sim/chat-completions.response.json")
	prom := fixture(t, "metrics/llm-d-inference-sim-idle.prom")
	seen := make(chan []string, 16)
	pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			_, _ = w.Write(prom)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		seen <- r.Header.Values(key)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(chat)
	}))
	t.Cleanup(pod.Close)
	return pod, seen
}

// strconvQuote is s as a JSON string.
func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestKeysFileRejected: a keys file that would not do what it says is
// refused with the line at fault, and no error repeats a key.
func TestKeysFileRejected(t *testing.T) {
	const key = "sk-0123456789abcdef"
	for _, tc := range []struct{ name, file, want string }{
		{"three fields", "a " + key + " extra\n", "line 1: want \"name key\" or a key alone, found 3 fields"},
		{"short key", "# c\na sk-short\n", "line 2: the key is shorter than 16 characters"},
		{"key twice", "a " + key + "\nb " + key + "\n", "line 2: the key of line 1 again"},
		{"name twice", "a " + key + "\na " + key + "x\n", `line 2: name "a" is also line 1's`},
		{"not ASCII", "a sk-0123456789abcdé\n", "line 1: the key has a character that is not visible ASCII"},
		{"no keys", "# none yet\n\n", "no keys: every request would be refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseKeys([]byte(tc.file))
			require.Error(t, err)
			assert.Equal(t, tc.want, err.Error())
			assert.NotRegexp(t, regexp.MustCompile(`sk-[0-9a-z]{4,}`), err.Error(), "no key in the message")
		})
	}
	ks, err := parseKeys([]byte("a " + key + "\r\n" + key + "x\r\n")) // a file from Windows
	require.NoError(t, err)
	assert.Len(t, ks.keys, 2)
}

// TestAuthConfigRejected: auth and upstream credential files are checked
// where the configuration is built, so that a start, -check and a reload
// refuse them alike.
func TestAuthConfigRejected(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	twoLines := filepath.Join(dir, "two-lines")
	require.NoError(t, os.WriteFile(twoLines, []byte("vllm-key-one\nvllm-key-two\n"), 0o600))
	for _, tc := range []struct{ name, yaml, want string }{
		{"auth without a keys file", "auth: {}\npools: [{name: a}]", "auth: keysFile is required"},
		{"a keys file that does not exist", "auth: {keysFile: /nonexistent/keys}\npools: [{name: a}]",
			"auth.keysFile: open /nonexistent/keys: no such file or directory"},
		{"an upstream key file that does not exist", "pools: [{name: a, upstreamKeyFile: /nonexistent/key}]",
			`pool "a": upstreamKeyFile: open /nonexistent/key`},
		{"an empty upstream key file", "pools: [{name: a, upstreamKeyFile: " + empty + "}]", "upstreamKeyFile " + empty + ": empty"},
		{"an upstream key file of two lines", "pools: [{name: a, upstreamKeyFile: " + twoLines + "}]",
			"the key is not one line of visible ASCII"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := buildConfig(tc.yaml)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestREADMEKeysFile: the keys file the README shows is one the gateway
// takes, with the names it says.
func TestREADMEKeysFile(t *testing.T) {
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)```\n(# name key, one per line.*?)```").FindSubmatch(b)
	require.NotNil(t, m, "the README's keys file")
	ks, err := parseKeys(m[1])
	require.NoError(t, err)
	var names []string
	for _, k := range ks.keys {
		names = append(names, k.name)
	}
	assert.ElementsMatch(t, []string{"team-a", "ci"}, names)
}
