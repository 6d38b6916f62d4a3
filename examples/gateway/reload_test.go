package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/signals"
)

const qwen = "Qwen/Qwen2.5-7B-Instruct"

// twoPools is gatewayYAML's llama pool over llama and, when qwenAddr is
// not empty, a qwen pool over that pod, whose picker section is qwenPicker.
func twoPools(llama []string, qwenAddr, qwenPicker string) string {
	y := gatewayYAML(llama...)
	if qwenAddr != "" {
		y += `  - name: qwen
    models: [` + qwen + `]
` + qwenPicker + `    endpoints:
      - {name: pod-q, address: ` + qwenAddr + `}
`
	}
	return y
}

// models lists the ids /v1/models answers with.
func models(t *testing.T, url string) []string {
	t.Helper()
	r, err := http.Get(url + "/v1/models")
	require.NoError(t, err)
	defer r.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(r.Body).Decode(&list))
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids
}

// TestReload applies configurations to a running gateway: pools and
// endpoints added and removed while a stream is in flight on the endpoint
// removed, an endpoint kept with its state, the log level, refused
// configurations that change nothing, and a restart-only setting kept.
func TestReload(t *testing.T) {
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	a, b := newPod(t, hold), newPod(t, hold)
	t.Cleanup(release)
	c, q := newPod(t, nil), newPod(t, nil)

	cfg, err := ParseConfig([]byte(twoPools([]string{a.addr(), b.addr()}, "", "")))
	require.NoError(t, err)
	var logs syncBuf
	level := new(slog.LevelVar)
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: level}))
	g, err := NewGateway(cfg, log)
	require.NoError(t, err)
	g.level = level
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, g.Start(ctx))
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(func() {
		srv.Close()
		cancel()
		_ = g.Close(context.Background())
	})
	url := srv.URL

	// A stream held open on one of the two pods.
	resp, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	_, err = br.ReadString('\n')
	require.NoError(t, err)
	gone, kept := a, b
	if b.requests.Load() == 1 {
		gone, kept = b, a
	}
	require.Equal(t, int64(1), gone.requests.Load())
	keptName := "pod-a"
	if kept == b {
		keptName = "pod-b"
	}
	keptEp := endpointNamed(g, "llama", keptName)
	require.NotNil(t, keptEp)

	// Reload: the streaming pod leaves the pool, c joins it, a qwen pool
	// appears, and the log level drops to debug.
	next := twoPools([]string{kept.addr(), c.addr()}, q.addr(), "") + "logLevel: debug\n"
	// gatewayYAML names endpoints by position: the kept pod must keep its
	// name (and c take the other) for its state to carry over.
	if keptName == "pod-b" {
		next = twoPools([]string{c.addr(), kept.addr()}, q.addr(), "") + "logLevel: debug\n"
	}
	cfg2, err := ParseConfig([]byte(next))
	require.NoError(t, err)
	require.NoError(t, g.Reload(cfg2))

	release()
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"), "the stream on the removed endpoint completed")

	assert.True(t, keptEp == endpointNamed(g, "llama", keptName), "the unchanged endpoint keeps its state (the same *signals.Endpoint)")
	assert.Contains(t, models(t, url), qwen)
	for range 20 {
		require.Equal(t, 200, postChat(t, url, `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`))
	}
	assert.Equal(t, int64(1), gone.requests.Load(), "no request reaches the removed endpoint")
	assert.Equal(t, int64(20), kept.requests.Load()+c.requests.Load(), "the kept and the new endpoint serve the pool")
	for range 3 {
		require.Equal(t, 200, postChat(t, url, `{"model":"`+qwen+`","messages":[{"role":"user","content":"hi"}]}`))
	}
	assert.Equal(t, int64(3), q.requests.Load(), "the new pool serves its model")
	require.Eventually(t, func() bool { return c.scrapes.Load() > 0 && q.scrapes.Load() > 0 },
		5*time.Second, 5*time.Millisecond, "the new endpoints are scraped")
	time.Sleep(100 * time.Millisecond) // a scrape of the removed pod in flight completes
	before := gone.scrapes.Load()
	time.Sleep(200 * time.Millisecond) // ten scrape intervals
	assert.Equal(t, before, gone.scrapes.Load(), "the removed endpoint is no longer scraped")
	assert.Equal(t, slog.LevelDebug, level.Level())
	m := scrapeGateway(t, url)
	assert.Equal(t, 1.0, m[`inferroute_gateway_config_reloads_total{otel_scope_name="github.com/inferroute/inferroute/examples/gateway",otel_scope_schema_url="",otel_scope_version="",result="success"}`])
	v, ok := sum(m, "inferroute_gateway_config_last_reload_successful")
	assert.True(t, ok)
	assert.Equal(t, 1.0, v)

	// Refused: an unknown scorer in qwen's picker, with a new pool beside
	// it. Nothing changes.
	// The new pool comes first, so that it is built before qwen fails.
	bad := gatewayYAML(a.addr()) + `  - name: mistral
    models: [mistral]
    endpoints:
      - {name: pod-m, address: ` + c.addr() + `}
` + strings.TrimPrefix(twoPools(nil, q.addr(), "    picker:\n      scorers: [{name: no-such-scorer, weight: 1}]\n"), gatewayYAML())
	cfg3, err := ParseConfig([]byte(bad))
	require.NoError(t, err)
	err = g.Reload(cfg3)
	require.ErrorContains(t, err, `pool "qwen"`)
	require.ErrorContains(t, err, "no-such-scorer")
	assert.NotContains(t, models(t, url), "mistral")
	assert.True(t, keptEp == endpointNamed(g, "llama", keptName), "the refused configuration kept the endpoint")
	assert.Len(t, g.pools["llama"].eps, 2, "the refused configuration's single llama endpoint was not applied")
	require.Equal(t, 200, postChat(t, url, `{"model":"`+qwen+`","messages":[{"role":"user","content":"hi"}]}`))
	assert.Equal(t, int64(4), q.requests.Load())
	m = scrapeGateway(t, url)
	v, _ = sum(m, "inferroute_gateway_config_last_reload_successful")
	assert.Equal(t, 0.0, v)
	v, _ = sum(m, "inferroute_gateway_config_reloads_total", `result="failure"`)
	assert.Equal(t, 1.0, v)
	_, ok = sum(m, "inferroute_prefix_index_entries", `pool="mistral"`)
	assert.False(t, ok, "the refused pool's index gauges were unregistered")
	assert.Contains(t, logs.String(), `"msg":"config reload refused; the running configuration stays"`)

	// Refused: a model served by two pools (the routing table's check).
	dup := twoPools([]string{a.addr()}, q.addr(), "") + `  - name: dup
    models: [` + qwen + `]
    endpoints:
      - {name: pod-d, address: ` + c.addr() + `}
`
	cfg4, err := ParseConfig([]byte(dup))
	require.NoError(t, err)
	require.ErrorContains(t, g.Reload(cfg4), qwen)
	assert.Len(t, g.pools, 2)

	// Applied: qwen removed; the read-header timeout changed, which takes
	// effect at restart only.
	cfg5, err := ParseConfig([]byte(twoPools([]string{kept.addr()}, "", "") + "readHeaderTimeout: 3s\n"))
	require.NoError(t, err)
	require.NoError(t, g.Reload(cfg5))
	assert.NotContains(t, models(t, url), qwen)
	r, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"`+qwen+`","messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(r.Body)
	_ = r.Body.Close()
	assert.Equal(t, http.StatusNotFound, r.StatusCode)
	assert.Contains(t, string(body), `"code":"model_not_found"`)
	assert.Equal(t, 10*time.Second, time.Duration(g.cfg.ReadHeaderTimeout), "the running value stays in force")
	assert.Contains(t, logs.String(), `"msg":"config reload: setting takes effect at restart; the running value stays","setting":"readHeaderTimeout"`)
	assert.Equal(t, slog.LevelInfo, level.Level(), "the level follows the file (info by default)")
	m = scrapeGateway(t, url)
	v, _ = sum(m, "inferroute_gateway_config_last_reload_successful")
	assert.Equal(t, 1.0, v)
	v, _ = sum(m, "inferroute_gateway_config_reloads_total", `result="success"`)
	assert.Equal(t, 2.0, v)
}

// endpointNamed is pool's endpoint called name, or nil.
func endpointNamed(g *Gateway, pool, name string) *signals.Endpoint {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, ep := range g.pools[pool].eps {
		if ep.Name == name {
			return ep
		}
	}
	return nil
}

// writeFile replaces path's content the safe way, renaming a complete file
// into place.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(content), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// TestWatchConfig drives watchConfig with a fake SIGHUP and a file
// checked every 5 ms: a change is sent once, the unchanged file is not, an
// empty file is skipped on a check and an error on SIGHUP, a file that
// does not parse is sent as its error once, SIGHUP sends even an unchanged
// file, and the command line's adjustment is applied to every one.
func TestWatchConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	one := gatewayYAML("127.0.0.1:9001")
	writeFile(t, path, one)
	hup := make(chan os.Signal, 1)
	out := make(chan configLoad)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		watchConfig(ctx, path, 5*time.Millisecond, hup, func(c *Config) { c.Listen = "127.0.0.1:7777" }, out)
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	next := func() configLoad {
		t.Helper()
		select {
		case l := <-out:
			return l
		case <-time.After(5 * time.Second):
			t.Fatal("nothing sent")
			return configLoad{}
		}
	}
	quiet := func(why string) {
		t.Helper()
		select {
		case l := <-out:
			t.Fatalf("%s, yet sent %+v", why, l)
		case <-time.After(100 * time.Millisecond): // twenty checks
		}
	}

	quiet("the file is as run started with it")
	writeFile(t, path, gatewayYAML("127.0.0.1:9002"))
	l := next()
	require.NoError(t, l.err)
	assert.Equal(t, "127.0.0.1:9002", l.cfg.Pools[0].Endpoints[0].Address)
	assert.Equal(t, "127.0.0.1:7777", l.cfg.Listen, "the -listen override")
	quiet("the file did not change again")

	writeFile(t, path, "")
	quiet("an empty file is skipped on a check")
	hup <- syscall.SIGHUP
	l = next()
	assert.ErrorIs(t, l.err, errEmptyConfig)

	writeFile(t, path, "pools: [")
	l = next()
	assert.ErrorContains(t, l.err, "gateway config")
	quiet("the same bad content is reported once")

	writeFile(t, path, one)
	l = next()
	require.NoError(t, l.err)
	assert.Equal(t, "127.0.0.1:9001", l.cfg.Pools[0].Endpoints[0].Address)
	hup <- syscall.SIGHUP
	l = next()
	require.NoError(t, l.err, "SIGHUP sends the unchanged file")
	assert.Equal(t, "127.0.0.1:9001", l.cfg.Pools[0].Endpoints[0].Address)

	require.NoError(t, os.Remove(path))
	l = next()
	assert.ErrorIs(t, l.err, os.ErrNotExist, "a file gone is reported")
	quiet("once")
}

// TestSIGHUPReloads runs the built binary, rewrites its configuration
// with a second pool, and sends SIGHUP: the process keeps serving, lists
// and routes the new model, and logs the reload; a broken file then is
// refused, logged and leaves the second pool in place.
func TestSIGHUPReloads(t *testing.T) {
	bin := gatewayBinary(t)
	a, q := newPod(t, nil), newPod(t, nil)
	cfgPath := filepath.Join(t.TempDir(), "gateway.yaml")
	writeFile(t, cfgPath, gatewayYAML(a.addr()))
	addr := deadAddr(t)
	cmd, stderr, exited := startBinary(t, bin, cfgPath, addr)
	url := "http://" + addr
	require.NotContains(t, models(t, url), qwen)

	writeFile(t, cfgPath, twoPools([]string{a.addr()}, q.addr(), ""))
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), `"msg":"config reloaded"`) },
		10*time.Second, 10*time.Millisecond, "the reload is logged: %s", stderr.String())
	assert.Contains(t, models(t, url), qwen)
	require.Equal(t, 200, postChat(t, url, `{"model":"`+qwen+`","messages":[{"role":"user","content":"hi"}]}`))
	assert.Equal(t, int64(1), q.requests.Load())

	writeFile(t, cfgPath, "pools: [")
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool {
		return strings.Contains(stderr.String(), `"msg":"config reload refused; the running configuration stays"`)
	},
		10*time.Second, 10*time.Millisecond, "the refusal is logged: %s", stderr.String())
	require.Equal(t, 200, postChat(t, url, `{"model":"`+qwen+`","messages":[{"role":"user","content":"hi"}]}`))
	assert.Equal(t, int64(2), q.requests.Load())
	select {
	case err := <-exited:
		t.Fatalf("the process exited: %v\n%s", err, stderr.String())
	default:
	}
}

// TestAccessLog: accessLog writes one JSON line per request, apart from the
// diagnostic log and whatever its level, and a reload turns it on and off;
// with requestIds, the line and the response carry the id made.
func TestAccessLog(t *testing.T) {
	a := newPod(t, nil)
	const extra = "logLevel: error\nrouter: {requestIds: true}\n"
	cfg, err := ParseConfig([]byte(gatewayYAML(a.addr()) + extra))
	require.NoError(t, err)
	require.False(t, cfg.AccessLog, "off by default")
	var access syncBuf
	g, err := newGateway(cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), &access)
	require.NoError(t, err)
	startT(t, g)
	// ServeHTTP returns after the line is written.
	chat := func() string { return serveChat(t, g, "llama").Get("X-Request-Id") }
	lines := func() []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(access.String()), "\n") {
			if l == "" {
				continue
			}
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(l), &m), l)
			out = append(out, m)
		}
		return out
	}

	chat()
	assert.Empty(t, lines(), "off")

	on, err := ParseConfig([]byte(gatewayYAML(a.addr()) + extra + "accessLog: true\n"))
	require.NoError(t, err)
	require.NoError(t, g.Reload(on))
	id := chat()
	assert.Regexp(t, `^[0-9a-f]{32}$`, id, "requestIds: one made")
	got := lines()
	require.Len(t, got, 1, "on after the reload, though logLevel is error")
	assert.Equal(t, "request", got[0]["msg"])
	assert.Equal(t, 200.0, got[0]["status"])
	assert.Equal(t, "llama", got[0]["model"])
	assert.Equal(t, "llama", got[0]["pool"])
	assert.Equal(t, "pod-a", got[0]["endpoint"])
	assert.Equal(t, 1.0, got[0]["attempts"])
	assert.Equal(t, id, got[0]["request_id"])

	require.NoError(t, g.Reload(cfg))
	chat()
	assert.Len(t, lines(), 1, "off again")
}

// TestReloadHalfLife: a pool's latency predictor takes the staleness
// half-life of the picker configuration a reload brings.
func TestReloadHalfLife(t *testing.T) {
	a := newPod(t, nil)
	cfg, err := ParseConfig([]byte(gatewayYAML(a.addr())))
	require.NoError(t, err)
	g, err := NewGateway(cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	pred := g.pools["llama"].pred
	require.Equal(t, picker.DefaultHalfLife, pred.HalfLife())

	next, err := ParseConfig([]byte(strings.Replace(gatewayYAML(a.addr()), "    picker:\n", "    picker:\n      stalenessHalfLife: 7s\n", 1)))
	require.NoError(t, err)
	require.NoError(t, g.Reload(next))
	assert.Same(t, pred, g.pools["llama"].pred, "the predictor stays, with what it learnt")
	assert.Equal(t, 7*time.Second, pred.HalfLife())
}

// TestReloadReleasesRemovedPools: a pool that a reload removes leaves no
// per-endpoint counts or index gauges in /metrics, where before its
// callbacks stayed registered with the meter provider for the life of the
// process, one set per removal.
func TestReloadReleasesRemovedPools(t *testing.T) {
	a, q := newPod(t, nil), newPod(t, nil)
	cfg, err := ParseConfig([]byte(twoPools([]string{a.addr()}, q.addr(), "")))
	require.NoError(t, err)
	g, err := NewGateway(cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	metrics := func() string {
		t.Helper()
		w := httptest.NewRecorder()
		g.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		return w.Body.String()
	}
	serveChat(t, g, "llama")
	serveChat(t, g, qwen)
	before := metrics()
	require.Regexp(t, `inferroute_picks_total\{endpoint="pod-q",.*pool="qwen"\} 1`, before)
	require.Contains(t, before, `inferroute_prefix_index_entries{otel_scope_name="github.com/inferroute/inferroute/examples/gateway",otel_scope_schema_url="",otel_scope_version="",pool="qwen"}`)

	next, err := ParseConfig([]byte(twoPools([]string{a.addr()}, "", "")))
	require.NoError(t, err)
	require.NoError(t, g.Reload(next))
	after := metrics()
	assert.NotRegexp(t, `inferroute_picks_total\{[^}]*pool="qwen"`, after)
	assert.NotRegexp(t, `inferroute_requests_completed_total\{[^}]*pool="qwen"`, after)
	assert.NotRegexp(t, `inferroute_prefix_index_[a-z_]+\{[^}]*pool="qwen"`, after)
	assert.Regexp(t, `inferroute_picks_total\{endpoint="pod-a",.*pool="llama"\} 1`, after, "the pool that stays keeps its counts")
}

// serveChat serves a one-message chat for model through g's handler, in
// the test's goroutine (whatever the handler logs is written when it
// returns), requires a 200, and returns the response's header.
func serveChat(t *testing.T, g *Gateway, model string) http.Header {
	t.Helper()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
	r.Header.Set("Content-Type", "application/json")
	g.Handler().ServeHTTP(w, r)
	require.Equal(t, 200, w.Code, w.Body.String())
	return w.Header()
}

// TestWatchKeysFiles: with -watch, an edited API keys file or upstream
// key file is a change of the configuration, as a renewed certificate is,
// so that a key revoked in a mounted Secret stops working without a
// SIGHUP.
func TestWatchKeysFiles(t *testing.T) {
	dir := t.TempDir()
	path, keys, upstream := filepath.Join(dir, "gateway.yaml"), filepath.Join(dir, "keys"), filepath.Join(dir, "vllm-key")
	writeFile(t, keys, "team-a sk-team-a-0123456789abcdef\n")
	writeFile(t, upstream, "vllm-secret-0123456789\n")
	writeFile(t, path, gatewayYAML("127.0.0.1:9001")+"    upstreamKeyFile: "+upstream+"\nauth: {keysFile: "+keys+"}\n")
	out := make(chan configLoad)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		watchConfig(ctx, path, 5*time.Millisecond, nil, nil, out)
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	next := func(why string) {
		t.Helper()
		select {
		case l := <-out:
			require.NoError(t, l.err)
		case <-time.After(5 * time.Second):
			t.Fatal(why + ": nothing sent")
		}
	}
	quiet := func() {
		t.Helper()
		select {
		case l := <-out:
			t.Fatalf("nothing changed, yet sent %+v", l)
		case <-time.After(100 * time.Millisecond):
		}
	}
	quiet()
	writeFile(t, keys, "team-b sk-team-b-0123456789abcdef\n")
	next("a key revoked and another added")
	quiet()
	writeFile(t, upstream, "vllm-secret-rotated-0123\n")
	next("the pods' key rotated")
	quiet()
}
