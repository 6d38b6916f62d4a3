package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/inferroute/inferroute/internal/nettest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Configuration validation
// ---------------------------------------------------------------------------

// buildConfig runs ParseConfig and, when it succeeds, NewGateway and the
// logger construction main does: the error a user of the binary would see
// before the gateway serves.
func buildConfig(yaml string) error {
	cfg, err := ParseConfig([]byte(yaml))
	if err != nil {
		return err
	}
	g, err := NewGateway(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	return g.Close(context.Background())
}

// TestConfigRejected checks that bad configurations are rejected before
// the gateway serves, each with an error naming the offending field or
// value: ParseConfig's own checks, those of the routing table and the
// picker in NewGateway, and the log level.
func TestConfigRejected(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown top-level key", "listn: 127.0.0.1:1\npools: [{name: a}]", "listn"},
		{"unknown nested key", "scrape: {intervall: 1s}\npools: [{name: a}]", "intervall"},
		{"unknown endpoint key", "pools: [{name: a, endpoints: [{address: '127.0.0.1:1', label: {a: b}}]}]", "label"},
		{"unknown picker key", "pools: [{name: a, picker: {scorer: []}}]", "scorer"},
		{"unknown scorer param", "pools: [{name: a, picker: {scorers: [{name: queue, weight: 1, params: {bogus: 1}}]}}]", "bogus"},
		{"duplicate YAML key", "listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\npools: [{name: a}]", `"listen" already defined`},
		{"negative scorer weight", "pools: [{name: a, picker: {scorers: [{name: queue, weight: -1}]}}]", "weight: -1"},
		{"unknown scorer", "pools: [{name: a, picker: {scorers: [{name: qeue, weight: 1}]}}]", `"qeue"`},
		{"duplicate pool", "pools: [{name: a}, {name: a}]", `pool "a" is declared twice`},
		{"duplicate model across pools", "pools: [{name: a, models: [m]}, {name: b, models: [m]}]", `model "m" is declared twice`},
		{"model equal to an adapter", "pools: [{name: a, models: [m], adapters: {m: m}}]", `model "m" is declared twice`},
		{"pool without a name", "pools: [{models: [m]}]", "empty name"},
		{"endpoint without address", "pools: [{name: a, endpoints: [{name: x}]}]", "address is required"},
		{"alias outside its pool", "pools: [{name: a, models: [m], aliases: {x: y}}]", `alias "x"`},
		{"unknown defaultPool", "defaultPool: zz\npools: [{name: a}]", `default pool "zz"`},
		{"unknown fallbackPool", "fallbackPool: zz\npools: [{name: a}]", `fallback pool "zz"`},
		{"bad logLevel", "logLevel: loud\npools: [{name: a}]", "logLevel"},
		{"bad admission minConfidence", "pools: [{name: a, admission: {minConfidence: 2}}]", "minConfidence"},
		{"bad duration", "idleTimeout: 5\npools: [{name: a}]", "duration"},
		// Each of these would break the gateway only at run time.
		{"engine typo", "pools: [{name: a, endpoints: [{address: '127.0.0.1:1', engine: vlm}]}]", `engine: "vlm" is not one of`},
		{"address with a scheme", "pools: [{name: a, endpoints: [{address: 'http://127.0.0.1:8001'}]}]", "endpoints[0].address"},
		{"address without a port", "pools: [{name: a, endpoints: [{address: '127.0.0.1'}]}]", "endpoints[0].address"},
		{"address without a host", "pools: [{name: a, endpoints: [{address: ':8001'}]}]", "has no host"},
		{"port out of range", "pools: [{name: a, endpoints: [{address: '127.0.0.1:70000'}]}]", "is not a number from 0 to 65535"},
		{"address that is not an address", "pools: [{name: a, endpoints: [{address: 'not an address'}]}]", "endpoints[0].address"},
		{"bad metricsURL", "pools: [{name: a, endpoints: [{address: '127.0.0.1:1', metricsURL: '127.0.0.1:1/metrics'}]}]", "metricsURL"},
		{"duplicate endpoint name in a pool", "pools: [{name: a, endpoints: [{name: x, address: '127.0.0.1:1'}, {name: x, address: '127.0.0.1:2'}]}]",
			`endpoints[1]: name "x" is also endpoints[0]'s`},
		{"duplicate endpoint name across pools", "pools: [{name: a, endpoints: [{name: x, address: '127.0.0.1:1'}]}, {name: b, endpoints: [{name: x, address: '127.0.0.1:2'}]}]",
			`pools[1] (b).endpoints[0]: name "x" is also pools[0] (a).endpoints[0]'s`},
		{"same endpoint twice in a pool", "pools: [{name: a, endpoints: [{address: '127.0.0.1:1'}, {name: y, address: '127.0.0.1:1'}]}]",
			"endpoints[1]: address 127.0.0.1:1 is also endpoints[0]'s"},
		{"bad listen address", "listen: 8080\npools: [{name: a}]", "listen:"},
		{"negative readHeaderTimeout", "readHeaderTimeout: -1s\npools: [{name: a}]", "readHeaderTimeout: -1s is negative"},
		{"negative idleTimeout", "idleTimeout: -1s\npools: [{name: a}]", "idleTimeout: -1s is negative"},
		{"negative drainTimeout", "drainTimeout: -1s\npools: [{name: a}]", "drainTimeout: -1s is negative"},
		{"negative upstreamTimeout", "router: {upstreamTimeout: -1s}\npools: [{name: a}]", "router.upstreamTimeout"},
		{"negative streamIdleTimeout", "router: {streamIdleTimeout: -1s}\npools: [{name: a}]", "router.streamIdleTimeout"},
		{"negative scrape interval", "scrape: {interval: -1s}\npools: [{name: a}]", "scrape.interval"},
		{"negative maxBodyBytes", "router: {maxBodyBytes: -1}\npools: [{name: a}]", "router.maxBodyBytes"},
		{"negative failureThreshold", "scrape: {failureThreshold: -1}\npools: [{name: a}]", "scrape.failureThreshold"},
		{"adapter outside its pool's models", "pools: [{name: a, models: [m], adapters: {l: n}}]", `adapter "l" has base model "n"`},
		{"tls without a key", "tls: {certFile: /tmp/gw.pem}\npools: [{name: a}]", "tls: certFile and keyFile are both required"},
		{"tls files that do not exist", "tls: {certFile: /nonexistent/gw.pem, keyFile: /nonexistent/gw.key}\npools: [{name: a}]",
			"tls: /nonexistent/gw.pem and /nonexistent/gw.key: open /nonexistent/gw.pem: no such file or directory"},
		{"a second document", "pools: [{name: a}]\n---\npools: [{name: b}]\n", "more than one YAML document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := buildConfig(tc.yaml)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// ---------------------------------------------------------------------------
// /healthz
// ---------------------------------------------------------------------------

// deadAddr returns a loopback address nobody listens on now: a free port
// for a server the test starts.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// answersOK reports whether a GET of url answers 200 (the body is
// discarded): a server-is-up probe for require.Eventually.
func answersOK(url string) bool {
	r, err := http.Get(url)
	if err != nil {
		return false
	}
	_ = r.Body.Close()
	return r.StatusCode == http.StatusOK
}

// answers reports whether url answers with any HTTP response.
func answers(url string) bool {
	r, err := http.Get(url)
	if err != nil {
		return false
	}
	_ = r.Body.Close()
	return true
}

func healthz(t *testing.T, url string) (int, string) {
	t.Helper()
	r, err := http.Get(url + "/healthz")
	require.NoError(t, err)
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// TestHealthzNoEndpointReachable: with every endpoint down, /healthz
// must be 503, and 200 once one is up.
func TestHealthzNoEndpointReachable(t *testing.T) {
	t.Run("eventually 503 with every endpoint down", func(t *testing.T) {
		url, _ := startGateway(t, gatewayYAML(nettest.RefusedAddr(t), nettest.RefusedAddr(t)))
		require.Eventually(t, func() bool { c, _ := healthz(t, url); return c == 503 },
			5*time.Second, 10*time.Millisecond)
		_, body := healthz(t, url)
		assert.Equal(t, "no healthy endpoint\n", body)
		r, err := http.Get(url + "/readyz")
		require.NoError(t, err)
		_ = r.Body.Close()
		assert.Equal(t, 503, r.StatusCode, "/readyz is /healthz")
		assert.True(t, answersOK(url+"/livez"), "alive though not ready: no restart mends dead model servers")
	})
	t.Run("200 with one endpoint up", func(t *testing.T) {
		a := newPod(t, nil)
		url, _ := startGateway(t, gatewayYAML(nettest.RefusedAddr(t), a.addr()))
		require.Eventually(t, func() bool { c, _ := healthz(t, url); return c == 200 },
			5*time.Second, 10*time.Millisecond, "ready once the live pod answered a scrape")
		_, body := healthz(t, url)
		assert.Equal(t, "ok\n", body)
	})
	t.Run("no endpoint at all", func(t *testing.T) {
		url, _ := startGateway(t, "pools: [{name: a, models: [m]}]\n")
		code, _ := healthz(t, url)
		assert.Equal(t, 503, code)
	})
	t.Run("not 200 before any endpoint ever answered", func(t *testing.T) {
		// Endpoints start out "healthy" (signals.NewEndpoint); ready
		// also needs an answered scrape, or for the first failureThreshold
		// scrapes /healthz would say ok although no endpoint was ever
		// reached, and a readiness probe would admit a gateway that can
		// only answer 502.
		url, _ := startGateway(t, gatewayYAML(nettest.RefusedAddr(t)))
		code, body := healthz(t, url)
		assert.Equal(t, 503, code, "healthz with no endpoint ever reached: %q", body)
	})
}

// ---------------------------------------------------------------------------
// Slow clients
// ---------------------------------------------------------------------------

func withTimeouts(yaml, extra string) string {
	return strings.Replace(yaml, "drainTimeout: 10s\n", "drainTimeout: 10s\n"+extra, 1)
}

// TestSlowlorisCutByReadHeaderTimeout trickles a request's headers,
// a line every 100 ms: the connection is closed at readHeaderTimeout
// although bytes keep arriving, and no request is served.
func TestSlowlorisCutByReadHeaderTimeout(t *testing.T) {
	a := newPod(t, nil)
	url, _ := startGateway(t, withTimeouts(gatewayYAML(a.addr()), "readHeaderTimeout: 300ms\n"))
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	require.NoError(t, err)
	defer c.Close()
	start := time.Now()
	go func() {
		lines := []string{"POST /v1/chat/completions HTTP/1.1\r\n", "Host: x\r\n"}
		for i := 0; i < 30; i++ {
			lines = append(lines, fmt.Sprintf("X-Trickle-%d: 1\r\n", i))
		}
		for _, l := range lines {
			if _, err := c.Write([]byte(l)); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	b, err := io.ReadAll(c)
	took := time.Since(start)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection was still open after 5 s")
	assert.Less(t, took, 2*time.Second)
	assert.GreaterOrEqual(t, took, 250*time.Millisecond)
	assert.NotContains(t, string(b), "200 OK")
	assert.Zero(t, a.requests.Load())
}

// TestIdleTimeoutClosesKeepAlive: a keep-alive connection left idle
// after a request is closed by the gateway after idleTimeout.
func TestIdleTimeoutClosesKeepAlive(t *testing.T) {
	a := newPod(t, nil)
	url, _ := startGateway(t, withTimeouts(gatewayYAML(a.addr()), "idleTimeout: 300ms\n"))
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "the idle connection is closed by the server")
	assert.Less(t, time.Since(start), 2*time.Second)
}

// ---------------------------------------------------------------------------
// Graceful shutdown
// ---------------------------------------------------------------------------

// TestDrainTimeoutBoundsShutdown: a stream that outlives drainTimeout
// is cut and run returns at the bound instead of waiting for it.
func TestDrainTimeoutBoundsShutdown(t *testing.T) {
	hold := make(chan struct{})
	a := newPod(t, hold)
	t.Cleanup(func() { close(hold) }) // before the pod's Close (cleanups run last first)
	url, stop := startGateway(t, strings.Replace(gatewayYAML(a.addr()), "drainTimeout: 10s", "drainTimeout: 400ms", 1))
	resp, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"sql-lora","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(first, "data: "))

	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- stop() }()
	rest, _ := io.ReadAll(br)
	assert.NotContains(t, string(rest), "[DONE]", "the held stream cannot have finished")
	select {
	case err := <-errc:
		took := time.Since(start)
		assert.GreaterOrEqual(t, took, 350*time.Millisecond, "streams get drainTimeout to finish")
		assert.Less(t, took, 3*time.Second, "shutdown is bounded by drainTimeout")
		assert.ErrorIs(t, err, context.DeadlineExceeded, "an unclean drain is reported")
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after drainTimeout")
	}
}

// ---------------------------------------------------------------------------
// /metrics
// ---------------------------------------------------------------------------

var promSample = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$`)

// scrapeGateway returns the gateway's /metrics samples: name{labels} -> value.
func scrapeGateway(t *testing.T, url string) map[string]float64 {
	t.Helper()
	r, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer r.Body.Close()
	require.Equal(t, 200, r.StatusCode)
	out := map[string]float64{}
	sc := bufio.NewScanner(r.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		m := promSample.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		require.NoError(t, err, sc.Text())
		out[m[1]+m[2]] = v
	}
	return out
}

// sum adds the samples whose series is name with every label in labels.
func sum(samples map[string]float64, name string, labels ...string) (float64, bool) {
	total, found := 0.0, false
	for k, v := range samples {
		if !strings.HasPrefix(k, name+"{") && k != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(k, l) {
				ok = false
			}
		}
		if ok {
			total += v
			found = true
		}
	}
	return total, found
}

// TestMetricsMoveWithTraffic checks the gateway's own metrics by the
// names the README gives, and that their values follow the traffic: the
// request counter and duration histogram count each request, TTFT is split
// by stream, a 5xx from one pod counts a retry, and unknown model names do
// not create series.
func TestMetricsMoveWithTraffic(t *testing.T) {
	page := fixture(t, "metrics/llm-d-inference-sim-idle.prom")
	var failed sync.Once
	failing := make(chan struct{})
	broken := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = w.Write(page)
			return
		}
		failed.Do(func() { close(failing) })
		http.Error(w, "boom", http.StatusInternalServerError)
	}), ReadHeaderTimeout: time.Second}
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = broken.Serve(bln) }()
	t.Cleanup(func() { _ = broken.Close() })
	good := newPod(t, nil)
	url, _ := startGateway(t, gatewayYAML(bln.Addr().String(), good.addr()))

	post := func(body string) int { return postChat(t, url, body) }
	chat := `{"model":"` + base + `","messages":[{"role":"user","content":"hi"}]}`
	const reqs = `inferroute_router_requests_total`
	require.Equal(t, 200, post(chat))
	m1 := scrapeGateway(t, url)
	n1, ok := sum(m1, reqs, `code="200"`, `model="`+base+`"`, `pool="llama"`)
	require.True(t, ok, "%s after a request", reqs)
	d1, ok := sum(m1, "inferroute_router_request_duration_seconds_count", `code="200"`)
	require.True(t, ok)

	for range 4 {
		require.Equal(t, 200, post(chat))
	}
	require.Equal(t, 200, post(`{"model":"sql-lora","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	for i := range 3 {
		require.Equal(t, 404, post(fmt.Sprintf(`{"model":"no-such-model-%d","messages":[]}`, i)))
	}
	m2 := scrapeGateway(t, url)
	n2, _ := sum(m2, reqs, `code="200"`, `model="`+base+`"`)
	assert.Equal(t, n1+4, n2, "the request counter counts each request")
	d2, _ := sum(m2, "inferroute_router_request_duration_seconds_count", `code="200"`)
	assert.Equal(t, d1+5, d2, "the duration histogram counts each request")
	ts, ok := sum(m2, "inferroute_router_ttft_seconds_count", `stream="true"`, `model="sql-lora"`)
	assert.True(t, ok && ts == 1, "the streamed request's TTFT")
	tj, ok := sum(m2, "inferroute_router_ttft_seconds_count", `stream="false"`)
	assert.True(t, ok && tj >= 5, "the JSON requests' TTFT")
	nf, ok := sum(m2, reqs, `code="404"`)
	assert.True(t, ok && nf == 3, "404s counted")
	for k := range m2 {
		assert.NotContains(t, k, "no-such-model", "client-chosen model names must not become label values")
	}
	// The picker may not have chosen the broken pod yet: send requests
	// (each still answered 200 by the retry) until it has, a bounded number.
	picked := func() bool {
		select {
		case <-failing:
			return true
		default:
			return false
		}
	}
	for i := 0; i < 200 && !picked(); i++ {
		require.Equal(t, 200, post(chat))
	}
	require.True(t, picked(), "the broken pod was not picked in 200 requests")
	rt, ok := sum(scrapeGateway(t, url), "inferroute_router_retries_total", `pool="llama"`)
	assert.True(t, ok && rt >= 1, "a 5xx from the broken pod was retried and counted")
	_, ok = sum(m2, "go_goroutines")
	assert.True(t, ok, "Go runtime metrics")
	_, ok = sum(m2, "inferroute_picks_total")
	assert.True(t, ok, "the picker's metrics")
}

// postChat posts body to the gateway's chat completions path, reads the
// answer to its end and returns its status.
func postChat(t *testing.T, url, body string) int {
	t.Helper()
	r, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, r.Body)
	_ = r.Body.Close()
	return r.StatusCode
}

// TestPrefixIndexMetricsPerPool: each pool's prefix index exports its own
// series, labelled by pool. Before they were labelled, every index
// observed the same unlabelled gauges and /metrics showed whichever was
// observed last: with one busy pool and one idle, an empty index.
func TestPrefixIndexMetricsPerPool(t *testing.T) {
	one, two := newPod(t, nil), newPod(t, nil)
	url, _ := startGateway(t, `
listen: 127.0.0.1:0
scrape: {interval: 50ms}
pools:
  - name: one
    models: [`+base+`]
    endpoints:
      - {name: pod-one, address: `+one.addr()+`}
  - name: two
    models: [other-model]
    endpoints:
      - {name: pod-two, address: `+two.addr()+`}
`)
	prompt := strings.Repeat("You are a careful assistant. ", 80) // about 580 tokens
	body := `{"model":"` + base + `","messages":[{"role":"user","content":"` + prompt + `"}]}`
	for range 3 {
		require.Equal(t, 200, postChat(t, url, body))
	}
	m := scrapeGateway(t, url)
	for _, name := range []string{"inferroute_prefix_index_entries", "inferroute_prefix_index_blocks",
		"inferroute_prefix_index_endpoints", "inferroute_prefix_index_memory_bytes"} {
		busy, ok := sum(m, name, `pool="one"`)
		require.True(t, ok, "%s{pool=\"one\"}", name)
		assert.Positive(t, busy, "%s of the pool that took the requests", name)
		_, ok = sum(m, name, `pool="two"`)
		require.True(t, ok, "%s{pool=\"two\"}", name)
	}
	for _, name := range []string{"inferroute_prefix_index_entries", "inferroute_prefix_index_blocks", "inferroute_prefix_index_endpoints"} {
		idle, _ := sum(m, name, `pool="two"`)
		assert.Zero(t, idle, "%s of the idle pool", name)
	}
	eps, _ := sum(m, "inferroute_prefix_index_endpoints", `pool="one"`)
	assert.Equal(t, 1.0, eps, "pool one's index tracks its one endpoint")
}

// ---------------------------------------------------------------------------
// The binary: SIGTERM, JSON logs
// ---------------------------------------------------------------------------

// gatewayBinary builds this package into a temporary directory.
func gatewayBinary(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gateway")
	out, err := exec.Command("go", "build", "-o", path, ".").CombinedOutput()
	require.NoError(t, err, "go build:\n%s", out)
	return path
}

// syncBuf is an io.Writer safe for a process's output and the test.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startBinary runs the gateway binary bin on the configuration at
// cfgPath, listening on addr, and waits until it answers /healthz. It
// returns the process, its stderr, and a channel that delivers its exit;
// a process still running when the test ends is killed.
func startBinary(t *testing.T, bin, cfgPath, addr string) (*exec.Cmd, *syncBuf, <-chan error) {
	t.Helper()
	cmd := exec.Command(bin, "-config", cfgPath, "-listen", addr)
	stderr := new(syncBuf)
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	gone := make(chan struct{}) // closed once the process has exited, whoever reads exited
	go func() {
		exited <- cmd.Wait()
		close(gone)
	}()
	t.Cleanup(func() {
		select {
		case <-gone:
		default:
			_ = cmd.Process.Kill()
			<-gone
		}
	})
	require.Eventually(t, func() bool { return answersOK("http://" + addr + "/healthz") },
		10*time.Second, 20*time.Millisecond, "the binary serves: %s", stderr.String())
	return cmd, stderr, exited
}

// TestSIGTERMDrainsStream runs the built binary, opens an SSE stream
// whose pod holds its last event, sends SIGTERM and checks: new
// connections are refused, the stream completes, the process exits 0, and
// its stderr is slog JSON including the drain.
func TestSIGTERMDrainsStream(t *testing.T) {
	bin := gatewayBinary(t)
	hold := make(chan struct{})
	var holdOnce sync.Once
	release := func() { holdOnce.Do(func() { close(hold) }) }
	a := newPod(t, hold)
	t.Cleanup(release) // before the pod's Close (cleanups run last first)
	cfgPath := filepath.Join(t.TempDir(), "gateway.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(gatewayYAML(a.addr())), 0o600))
	addr := deadAddr(t)
	cmd, stderr, exited := startBinary(t, bin, cfgPath, addr)
	url := "http://" + addr

	resp, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, first, `"model":"llama"`)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return true
		}
		_ = c.Close()
		return false
	}, 5*time.Second, 5*time.Millisecond, "new connections are refused after SIGTERM")
	select {
	case err := <-exited:
		t.Fatalf("the process exited with a stream in flight: %v\n%s", err, stderr.String())
	case <-time.After(200 * time.Millisecond):
	}
	release()
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"), "the stream completed during the drain")
	select {
	case err := <-exited:
		assert.NoError(t, err, "exit status after a clean drain")
	case <-time.After(10 * time.Second):
		t.Fatal("the process did not exit after the drain")
	}
	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var rec map[string]any
		if assert.NoError(t, json.Unmarshal([]byte(line), &rec), "slog JSON line: %q", line) {
			msgs = append(msgs, fmt.Sprint(rec["msg"]))
		}
	}
	assert.Subset(t, msgs, []string{"gateway listening", "draining", "stopped"})
}

// ---------------------------------------------------------------------------
// The README, as written
// ---------------------------------------------------------------------------

// repoRoot is the repository root, where the README's commands run.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.work"))
	require.NoError(t, err)
	return root
}

// needPorts fails the test, saying why, when one of the README's fixed
// ports is taken: the README's commands would fail there too.
func needPorts(t *testing.T, addrs ...string) {
	t.Helper()
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("the README's commands need %s free: %v", a, err)
		}
		_ = ln.Close()
	}
}

// startCommand starts a README command line (no shell) in its own process
// group, stopped with SIGTERM to that group when the test ends.
func startCommand(t *testing.T, dir string, out io.Writer, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	return cmd
}

// curlCmd is a curl command of the README, parsed.
type curlCmd struct {
	line    string
	url     string
	headers [][2]string
	data    string
	include bool // -i
}

// readmeCurls returns the README's curl commands (backslash continuations
// joined, single quotes honoured) in order.
func readmeCurls(t *testing.T) []curlCmd {
	t.Helper()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	var out []curlCmd
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "curl ") {
			continue
		}
		if i := strings.Index(line, " | "); i >= 0 {
			line = line[:i]
		}
		words := shellWords(t, line)
		c := curlCmd{line: line}
		for i := 1; i < len(words); i++ {
			switch w := words[i]; {
			case w == "-H":
				i++
				k, v, _ := strings.Cut(words[i], ":")
				c.headers = append(c.headers, [2]string{strings.TrimSpace(k), strings.TrimSpace(v)})
			case w == "-d":
				i++
				c.data = words[i]
			case strings.HasPrefix(w, "-"):
				c.include = c.include || strings.Contains(w, "i")
			default:
				c.url = w
			}
		}
		out = append(out, c)
	}
	return out
}

// shellWords splits a command line the way sh does for the README's
// commands: blanks separate words, single quotes quote.
func shellWords(t *testing.T, s string) []string {
	var words []string
	var cur strings.Builder
	in, has := false, false
	for _, r := range s {
		switch {
		case r == '\'':
			in, has = !in, true
		case !in && (r == ' ' || r == '\t'):
			if has {
				words = append(words, cur.String())
				cur.Reset()
				has = false
			}
		default:
			cur.WriteRune(r)
			has = true
		}
	}
	require.False(t, in, "unbalanced quote in %q", s)
	if has {
		words = append(words, cur.String())
	}
	return words
}

// do sends c as curl would (-d means POST) to base instead of
// http://127.0.0.1:8080.
func (c curlCmd) do(t *testing.T, base string) (*http.Response, string) {
	t.Helper()
	url := strings.Replace(c.url, "http://127.0.0.1:8080", base, 1)
	method, body := http.MethodGet, io.Reader(nil)
	if c.data != "" {
		method, body = http.MethodPost, strings.NewReader(c.data)
	}
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	if c.data != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // curl's default
	}
	for _, h := range c.headers {
		req.Header.Set(h[0], h[1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, c.line)
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err, c.line)
	return resp, string(b)
}

// sseData returns the data payloads of an SSE body.
func sseData(body string) []string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if d, ok := strings.CutPrefix(l, "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// TestREADMECurl runs the README's "Run it" commands as written
// (go run of the overhead backend on :8001 and :8002, go run of the
// gateway with the shipped gateway.yaml on :8080, from the repository
// root), then every curl command of its "curl" section, and checks the
// answers are what the README says.
func TestREADMECurl(t *testing.T) {
	needPorts(t, "127.0.0.1:8080", "127.0.0.1:8001", "127.0.0.1:8002")
	root := repoRoot(t)
	var logs syncBuf
	startCommand(t, root, &logs, "go", "run", "./benchmarks/overhead/backend", "-listen", "127.0.0.1:8001")
	startCommand(t, root, &logs, "go", "run", "./benchmarks/overhead/backend", "-listen", "127.0.0.1:8002")
	startCommand(t, root, &logs, "go", "run", "./examples/gateway", "-config", "examples/gateway/gateway.yaml")
	const base8080 = "http://127.0.0.1:8080"
	chatBody := `{"model":"` + base + `","messages":[{"role":"user","content":"x"}]}`
	require.Eventually(t, func() bool {
		r, err := http.Post(base8080+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			return false
		}
		_ = r.Body.Close()
		return r.StatusCode == 200
	}, 120*time.Second, 100*time.Millisecond, "the README's gateway and backends serve: %s", logs.String())
	// Ready once a backend answered a scrape, every 50 ms.
	require.Eventually(t, func() bool { return answersOK(base8080 + "/healthz") },
		10*time.Second, 10*time.Millisecond)

	curls := readmeCurls(t)
	var section []curlCmd
	for _, c := range curls {
		if strings.HasPrefix(c.url, "http://127.0.0.1:8080") && !strings.Contains(c.line, "Say hello") &&
			!strings.Contains(c.data, "Count users") {
			section = append(section, c) // the demo's two commands are tested with the demo
		}
	}
	require.Len(t, section, 9, "the curl section's commands")
	for i, c := range section {
		name := c.url[len("http://127.0.0.1:8080"):]
		if m := regexp.MustCompile(`"model":"([^"]*)"`).FindStringSubmatch(c.data); m != nil {
			name += " " + m[1]
		}
		t.Run(fmt.Sprintf("%d %s", i, name), func(t *testing.T) {
			t.Log(c.line)
			resp, body := c.do(t, base8080)
			switch {
			case strings.Contains(c.data, `"gpt-9"`):
				assert.Equal(t, 404, resp.StatusCode)
				assert.Equal(t, `{"error":{"message":"model not found: \"gpt-9\"","type":"invalid_request_error","param":"model","code":"model_not_found"}}`,
					strings.TrimSpace(body), "the body the README shows")
			case strings.Contains(c.data, `"stream":true`):
				require.Equal(t, 200, resp.StatusCode, body)
				assert.Contains(t, resp.Header.Get("Content-Type"), "text/event-stream")
				data := sseData(body)
				require.NotEmpty(t, data)
				assert.Equal(t, "[DONE]", data[len(data)-1])
				for _, d := range data[:len(data)-1] {
					assert.Contains(t, d, `"model":"llama"`, "every chunk comes back with the alias")
				}
				assert.Contains(t, data[len(data)-2], `"usage"`, "token usage in the last chunk")
			case c.data != "":
				require.Equal(t, 200, resp.StatusCode, body)
				var v struct {
					Model   string            `json:"model"`
					Choices []json.RawMessage `json:"choices"`
				}
				require.NoError(t, json.Unmarshal([]byte(body), &v), body)
				assert.NotEmpty(t, v.Choices)
				if strings.Contains(c.data, `"model":"llama"`) {
					assert.Equal(t, "llama", v.Model, "alias rewritten back")
				}
			case strings.HasSuffix(c.url, "/v1/models"):
				require.Equal(t, 200, resp.StatusCode)
				for _, id := range []string{base, "sql-lora", "chat-lora", "llama", "Qwen/Qwen2.5-7B-Instruct"} {
					assert.Contains(t, body, `"id":"`+id+`"`)
				}
			case strings.HasSuffix(c.url, "/v1/models/llama"):
				require.Equal(t, 200, resp.StatusCode)
				var m struct {
					ID, Object, OwnedBy, Root string
					Created                   int64
					Parent                    *string
				}
				require.NoError(t, json.Unmarshal([]byte(body), &m), body)
				assert.Equal(t, "llama", m.ID)
				assert.Equal(t, "model", m.Object)
				assert.Equal(t, base, m.Root, "the alias's served model")
				assert.Nil(t, m.Parent)
				assert.Positive(t, m.Created)
			case strings.HasSuffix(c.url, "/healthz"):
				assert.Equal(t, 200, resp.StatusCode)
				assert.Equal(t, "ok\n", body)
			case strings.HasSuffix(c.url, "/metrics"):
				assert.Equal(t, 200, resp.StatusCode)
				for _, name := range []string{"inferroute_router_requests_total", "inferroute_router_request_duration_seconds",
					"inferroute_router_ttft_seconds"} {
					assert.Contains(t, body, name, "| grep inferroute_router finds it")
				}
			default:
				t.Fatalf("no expectation for %q", c.line)
			}
		})
	}
}

// TestREADMEDemo runs `go run ./examples/gateway --demo` from the
// repository root as the README says and its two curl commands.
func TestREADMEDemo(t *testing.T) {
	needPorts(t, "127.0.0.1:8080")
	root := repoRoot(t)
	var out syncBuf
	startCommand(t, root, &out, "go", "run", "./examples/gateway", "--demo")
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "Ctrl-C stops the demo") },
		120*time.Second, 100*time.Millisecond, "the demo prints its instructions: %s", out.String())
	printed := out.String()
	assert.Contains(t, printed, "inferroute demo: 4 emulated vLLM pods serving meta-llama/Llama-3.1-8B-Instruct (adapters sql-lora, chat-lora):")
	assert.Contains(t, printed, "gateway on http://127.0.0.1:8080. Try:")

	var demo []curlCmd
	for _, c := range readmeCurls(t) {
		if strings.Contains(c.data, "Say hello") || strings.Contains(c.data, "Count users") {
			demo = append(demo, c)
		}
	}
	require.Len(t, demo, 2)
	const url = "http://127.0.0.1:8080"
	require.Eventually(t, func() bool { return answersOK(url + "/v1/models") },
		10*time.Second, 20*time.Millisecond)

	resp, body := demo[0].do(t, url)
	require.True(t, demo[0].include, "curl -si")
	assert.Equal(t, "HTTP/1.1", resp.Proto)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Regexp(t, `^(h100-0|a100-1|l4-2|l4-3)$`, resp.Header.Get("X-Inference-Pod"))
	assert.Equal(t, strconv.Itoa(len(body)), resp.Header.Get("Content-Length"))
	assert.Contains(t, body, `"model":"llama"`)
	assert.Contains(t, body, `"object":"text_completion"`)
	assert.Contains(t, body, `"completion_tokens":8`)

	resp, body = demo[1].do(t, url)
	assert.Equal(t, 200, resp.StatusCode)
	data := sseData(body)
	require.Len(t, data, 7, "role chunk, five content chunks, [DONE]: %s", body)
	assert.Equal(t, "[DONE]", data[6])
	for _, d := range data[:6] {
		assert.Contains(t, d, `"model":"sql-lora"`)
	}
	assert.Contains(t, data[0], `"role":"assistant"`)
	assert.Contains(t, data[5], `"finish_reason":"length"`)
}

// TestREADMEPprof runs the README's profiling commands: the gateway with
// -pprof, and go tool pprof -top against it, with a 1 s profile instead of
// the README's 10 s.
func TestREADMEPprof(t *testing.T) {
	needPorts(t, "127.0.0.1:8080", "127.0.0.1:6060")
	root := repoRoot(t)
	var logs syncBuf
	startCommand(t, root, &logs, "go", "run", "./examples/gateway", "-config", "examples/gateway/gateway.yaml", "-pprof", "127.0.0.1:6060")
	// The gateway opens the pprof listener before its own, with the
	// configuration read in between: wait for both.
	require.Eventually(t, func() bool {
		return answersOK("http://127.0.0.1:6060/debug/pprof/") && answers("http://127.0.0.1:8080/healthz")
	}, 120*time.Second, 100*time.Millisecond, "pprof and the gateway serve: %s", logs.String())
	r, err := http.Get("http://127.0.0.1:8080/debug/pprof/")
	require.NoError(t, err)
	_ = r.Body.Close()
	assert.NotEqual(t, 200, r.StatusCode, "pprof is never on the gateway's listener")
	// As written, through sh.
	// go tool pprof saves the profile in $PPROF_TMPDIR (else $HOME/pprof); HOME
	// stays, or the go command would build the tool again in a new cache.
	tmp := t.TempDir()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	line := regexp.MustCompile(`(?m)^go tool pprof -top .*$`).FindString(string(readme))
	require.Contains(t, line, "seconds=10", "the README's profiling command")
	cmd := exec.Command("sh", "-c", strings.Replace(line, "seconds=10", "seconds=1", 1))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PPROF_TMPDIR="+tmp)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "Type: cpu")
}

// TestCheckConfig: -check says whether the file would start the gateway,
// with a summary, or the reason it would not, without listening.
func TestCheckConfig(t *testing.T) {
	write := func(yaml string) string {
		path := filepath.Join(t.TempDir(), "gateway.yaml")
		require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
		return path
	}
	// The endpoint is never contacted: nothing listens there.
	good := write(gatewayYAML(deadAddr(t)))
	summary, err := checkConfig(good, "")
	require.NoError(t, err)
	assert.Equal(t, good+": configuration ok: 1 pools, 3 model names, 1 endpoints, listen 127.0.0.1:0", summary)
	summary, err = checkConfig(good, "127.0.0.1:9999")
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(summary, "listen 127.0.0.1:9999"), summary)

	for _, tc := range []struct{ name, yaml, want string }{
		{"an unknown scorer", strings.Replace(gatewayYAML(deadAddr(t)), "{name: queue, weight: 2}", "{name: qeueu, weight: 2}", 1), "qeueu"},
		{"a TLS file that is not there", gatewayYAML(deadAddr(t)) + "tls: {certFile: /nonexistent/c.pem, keyFile: /nonexistent/k.pem}\n", "/nonexistent/c.pem"},
		{"an unknown key", gatewayYAML(deadAddr(t)) + "listne: x\n", "listne"},
		{"a log level that is none", gatewayYAML(deadAddr(t)) + "logLevel: loud\n", "logLevel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := checkConfig(write(tc.yaml), "")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err = checkConfig(filepath.Join(t.TempDir(), "missing.yaml"), "")
	assert.ErrorIs(t, err, os.ErrNotExist)
}
