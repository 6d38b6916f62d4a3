package main

import (
	"bufio"
	"context"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixtures is shared/fixtures beside the checkout.
const fixtures = "../../../shared/fixtures"

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtures, name))
	require.NoError(t, err)
	return b
}

const base = "meta-llama/Llama-3.1-8B-Instruct"

// pod is an httptest model server answering with real llm-d-inference-sim
// captures: a chat completion, or its SSE stream, and a vLLM /metrics page.
type pod struct {
	srv      *httptest.Server
	requests atomic.Int64
	scrapes  atomic.Int64  // GETs of /metrics
	hold     chan struct{} // when non-nil, streams wait on it before their last event
	models   chan string   // the "model" the pod saw
}

func newPod(t *testing.T, hold chan struct{}) *pod {
	t.Helper()
	return newPodOn(t, hold, httptest.NewServer)
}

// newPodOn is newPod on a server started by start (httptest.NewServer or
// httptest.NewTLSServer).
func newPodOn(t *testing.T, hold chan struct{}, start func(http.Handler) *httptest.Server) *pod {
	t.Helper()
	p := &pod{hold: hold, models: make(chan string, 64)}
	chat := fixture(t, "openai/llm-d-inference-sim/chat-completions.response.json")
	sse := fixture(t, "openai/llm-d-inference-sim/chat-completions-lora-stream.response.sse")
	metrics := fixture(t, "metrics/llm-d-inference-sim-idle.prom")
	p.srv = start(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			p.scrapes.Add(1)
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = w.Write(metrics)
			return
		}
		p.requests.Add(1)
		body, _ := io.ReadAll(r.Body)
		stream := strings.Contains(string(body), `"stream":true`)
		switch {
		case strings.Contains(string(body), `"model":"`+base+`"`):
			p.models <- base
		case strings.Contains(string(body), `"model":"sql-lora"`):
			p.models <- "sql-lora"
		default:
			p.models <- "?"
		}
		if !stream {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(chat)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		events := strings.SplitAfter(string(sse), "\n\n")
		for i, ev := range events {
			if i == len(events)-2 && p.hold != nil {
				<-p.hold
			}
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *pod) addr() string { return p.srv.Listener.Addr().String() }

// startGateway runs the gateway on a loopback listener until the test ends
// (or stop is called) and returns its base URL and a stop function that
// waits for run to return.
func startGateway(t *testing.T, yaml string) (string, func() error) {
	t.Helper()
	cfg, err := ParseConfig([]byte(yaml))
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() { done <- run(ctx, cfg, ln, log, runOptions{}) }()
	var stopped atomic.Bool
	stop := func() error {
		cancel()
		if stopped.Swap(true) {
			return nil
		}
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			return errors.New("run did not return")
		}
	}
	t.Cleanup(func() { _ = stop() })
	return "http://" + ln.Addr().String(), stop
}

func gatewayYAML(addrs ...string) string {
	var eps strings.Builder
	for i, a := range addrs {
		eps.WriteString("      - name: pod-" + string(rune('a'+i)) + "\n        address: " + a +
			"\n        engine: vllm\n        labels: {inferroute.io/gpu: h100}\n")
	}
	return `
listen: 127.0.0.1:0
drainTimeout: 10s
scrape:
  interval: 20ms
pools:
  - name: llama
    models: [` + base + `]
    adapters: {sql-lora: ` + base + `}
    aliases: {llama: ` + base + `}
    picker:
      filters: [{name: healthy}]
      scorers:
        - {name: queue, weight: 2}
        - {name: kv-cache, weight: 2}
        - {name: running, weight: 1}
        - {name: lora, weight: 1}
    endpoints:
` + eps.String()
}

func TestOpenAISDK(t *testing.T) {
	a, b := newPod(t, nil), newPod(t, nil)
	url, _ := startGateway(t, gatewayYAML(a.addr(), b.addr()))
	client := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	ctx := context.Background()

	t.Run("chat completion through an alias", func(t *testing.T) {
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "llama",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello!")},
		})
		require.NoError(t, err)
		assert.Equal(t, "llama", resp.Model, "the served name is rewritten back to the alias")
		require.Len(t, resp.Choices, 1)
		assert.Equal(t, "I am fine, how ", resp.Choices[0].Message.Content)
		assert.Equal(t, int64(12), resp.Usage.PromptTokens)
		assert.Equal(t, base, podModel(t, a, b), "the pod sees the served name")
	})

	t.Run("streaming on a LoRA adapter", func(t *testing.T) {
		stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:         "sql-lora",
			Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello!")},
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		require.NoError(t, stream.Err())
		assert.Equal(t, 10, chunks)
		assert.Equal(t, "Testing, testing 1,2,", acc.Choices[0].Message.Content)
		assert.Equal(t, int64(33), acc.Usage.TotalTokens)
		assert.Equal(t, "sql-lora", podModel(t, a, b))
	})

	t.Run("unknown model", func(t *testing.T) {
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "gpt-9",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello!")},
		})
		var apiErr *openai.Error
		require.ErrorAs(t, err, &apiErr)
		assert.Equal(t, 404, apiErr.StatusCode)
		assert.Equal(t, "model_not_found", apiErr.Code)
		assert.Equal(t, "model", apiErr.Param)
	})

	t.Run("models list", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		require.NoError(t, err)
		var ids []string
		for _, m := range page.Data {
			ids = append(ids, m.ID)
		}
		assert.Equal(t, []string{base, "sql-lora", "llama"}, ids)
	})

	t.Run("model retrieve", func(t *testing.T) {
		// The alias is the gateway's own: no model server could answer it.
		for _, id := range []string{"llama", base, "sql-lora"} {
			m, err := client.Models.Get(ctx, id)
			require.NoError(t, err, id)
			assert.Equal(t, id, m.ID)
			assert.Equal(t, "inferroute", m.OwnedBy)
		}
		_, err := client.Models.Get(ctx, "gpt-9")
		var apiErr *openai.Error
		require.ErrorAs(t, err, &apiErr)
		assert.Equal(t, 404, apiErr.StatusCode)
		assert.Equal(t, "model_not_found", apiErr.Code)
	})
}

func podModel(t *testing.T, pods ...*pod) string {
	t.Helper()
	for {
		for _, p := range pods {
			select {
			case m := <-p.models:
				return m
			default:
			}
		}
		select {
		case <-time.After(time.Millisecond):
		case <-t.Context().Done():
			return ""
		}
	}
}

func TestHealthzAndMetrics(t *testing.T) {
	a := newPod(t, nil)
	url, _ := startGateway(t, gatewayYAML(a.addr()))
	// Ready once the pod has answered a scrape (every 50 ms here).
	require.Eventually(t, func() bool {
		r, err := http.Get(url + "/healthz")
		if err != nil {
			return false
		}
		_ = r.Body.Close()
		return r.StatusCode == 200
	}, 10*time.Second, 5*time.Millisecond)

	require.Equal(t, 200, postChat(t, url, `{"model":"`+base+`","messages":[{"role":"user","content":"hi"}]}`))

	r, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	b, _ := io.ReadAll(r.Body)
	_ = r.Body.Close()
	text := string(b)
	assert.Contains(t, text, `inferroute_router_requests_total{code="200",model="`+base+`"`)
	assert.Contains(t, text, "inferroute_router_ttft_seconds_bucket")
	assert.Contains(t, text, "go_goroutines")
	assert.Regexp(t, `(?m)^inferroute_picks_total\{endpoint="pod-a",otel_scope_name="[^"]+",otel_scope_schema_url="",otel_scope_version="",pool="llama"\} 1$`, text)
	assert.Regexp(t, `(?m)^inferroute_pick_duration_seconds_count\{otel_scope_name="[^"]+",otel_scope_schema_url="",otel_scope_version="",pool="llama"\} 1$`, text)
	assert.Regexp(t, `(?m)^target_info\{service_name="inferroute-gateway",`, text)
}

// TestServiceName checks the gateway's service.name: its own by default,
// the environment's when OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES
// set one, and a malformed OTEL_RESOURCE_ATTRIBUTES reported while the
// rest of it is kept.
func TestServiceName(t *testing.T) {
	name := func() (string, error) {
		res, err := serviceResource()
		v, _ := res.Set().Value("service.name")
		return v.AsString(), err
	}
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "")
	got, err := name()
	require.NoError(t, err)
	assert.Equal(t, "inferroute-gateway", got)

	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=edge-gw,deployment.environment=prod")
	got, err = name()
	require.NoError(t, err)
	assert.Equal(t, "edge-gw", got)

	t.Setenv("OTEL_SERVICE_NAME", "llm-gateway")
	got, err = name()
	require.NoError(t, err)
	assert.Equal(t, "llm-gateway", got, "OTEL_SERVICE_NAME wins over OTEL_RESOURCE_ATTRIBUTES")

	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=edge-gw,no-equals-sign")
	got, err = name()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no-equals-sign")
	assert.Equal(t, "edge-gw", got, "the well-formed attributes are kept")
}

func TestGracefulShutdownDrainsStreams(t *testing.T) {
	hold := make(chan struct{})
	a := newPod(t, hold)
	url, stop := startGateway(t, gatewayYAML(a.addr()))
	resp, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"sql-lora","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(first, "data: "))

	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// Shutdown has begun when new connections are refused.
	for {
		c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
		if err != nil {
			break
		}
		_ = c.Close()
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-stopped:
		t.Fatalf("run returned with a stream in flight: %v", err)
	default:
	}
	close(hold) // the pod finishes the stream
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"), "the stream completed during the drain")
	require.NoError(t, <-stopped)
}

// TestHTTPSPods runs the gateway against pods that serve HTTPS with a
// private certificate authority: requests, streams and metric scrapes go
// over TLS, trusting router.upstreamCAFile.
func TestHTTPSPods(t *testing.T) {
	a, b := newPodOn(t, nil, httptest.NewTLSServer), newPodOn(t, nil, httptest.NewTLSServer)
	ca := filepath.Join(t.TempDir(), "pods-ca.pem")
	var pemCerts []byte
	for _, p := range []*pod{a, b} {
		pemCerts = append(pemCerts, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})...)
	}
	require.NoError(t, os.WriteFile(ca, pemCerts, 0o600))
	yaml := strings.Replace(gatewayYAML(a.addr(), b.addr()), "scrape:\n",
		"router:\n  upstreamScheme: https\n  upstreamCAFile: "+ca+"\nscrape:\n", 1)
	url, _ := startGateway(t, yaml)

	for _, stream := range []bool{false, true} {
		r, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(
			`{"model":"`+base+`","stream":`+strconv.FormatBool(stream)+`,"messages":[{"role":"user","content":"hi"}]}`))
		require.NoError(t, err)
		body, err := io.ReadAll(r.Body)
		_ = r.Body.Close()
		require.NoError(t, err)
		require.Equal(t, 200, r.StatusCode, "stream %v: %s", stream, body)
		if stream {
			assert.True(t, strings.HasSuffix(string(body), "data: [DONE]\n\n"), "the whole stream relayed")
		} else {
			assert.Contains(t, string(body), `"usage"`)
		}
	}
	assert.Equal(t, int64(2), a.requests.Load()+b.requests.Load())
	require.Eventually(t, func() bool { return a.scrapes.Load() > 0 && b.scrapes.Load() > 0 },
		5*time.Second, 10*time.Millisecond, "both pods' metrics scraped over https")
}

// TestAdmission429 checks a pool's admission section end to end: a
// sheddable request whose TTFT objective no endpoint is predicted to meet
// is answered 429 with Retry-After and never reaches a pod; the same
// request at priority 0 is served.
func TestAdmission429(t *testing.T) {
	a := newPod(t, nil)
	// minConfidence 0 lets the GPU-label prior judge, so a cold gateway
	// sheds; a 1 µs objective no prediction meets.
	yaml := strings.Replace(gatewayYAML(a.addr()), "    endpoints:\n",
		"    admission: {minConfidence: 0}\n    endpoints:\n", 1)
	url, _ := startGateway(t, yaml)
	post := func(priority string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
			strings.NewReader(`{"model":"`+base+`","messages":[{"role":"user","content":"hi"}]}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-inferroute-priority", priority)
		req.Header.Set("x-slo-ttft-ms", "0.001")
		r, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = r.Body.Close() })
		return r
	}
	r := post("-1")
	body, _ := io.ReadAll(r.Body)
	require.Equal(t, 429, r.StatusCode, "%s", body)
	assert.Equal(t, "1", r.Header.Get("Retry-After"))
	assert.Contains(t, string(body), `"code":"rate_limit_exceeded"`)
	assert.Zero(t, a.requests.Load(), "a shed request never reaches a pod")

	r = post("0")
	_, _ = io.Copy(io.Discard, r.Body)
	assert.Equal(t, 200, r.StatusCode, "priority 0 is always admitted")
	assert.Equal(t, int64(1), a.requests.Load())
}

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name, yaml, err string
	}{
		{"unknown field", "pools: [{name: a, bogus: 1}]", "bogus"},
		{"unknown upstream scheme", "router: {upstreamScheme: ftp}\npools: [{name: a}]", `upstreamScheme: "ftp"`},
		{"CA file without https", "router: {upstreamCAFile: ca.pem}\npools: [{name: a}]", "needs router.upstreamScheme https"},
		{"no pools", "listen: :8080", "at least one pool"},
		{"endpoint without address", "pools: [{name: a, endpoints: [{name: x}]}]", "address is required"},
		{"bad duration", "drainTimeout: soon\npools: [{name: a}]", "duration"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.err)
		})
	}
	cfg, err := ParseConfig([]byte("pools: [{name: a}]"))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:8080", cfg.Listen)
	assert.Equal(t, 10*time.Second, time.Duration(cfg.ReadHeaderTimeout))
	assert.Nil(t, cfg.Pools[0].Picker, "no picker section means picker.DefaultConfig")

	for _, tc := range []struct{ name, pem, err string }{
		{"missing CA file", "", "no such file"},
		{"CA file without a certificate", "not a certificate\n", "no PEM certificate"},
	} {
		path := filepath.Join(t.TempDir(), "ca.pem")
		if tc.pem != "" {
			require.NoError(t, os.WriteFile(path, []byte(tc.pem), 0o600))
		}
		cfg, err := ParseConfig([]byte("router: {upstreamScheme: https, upstreamCAFile: " + path + "}\npools: [{name: a}]"))
		require.NoError(t, err, tc.name)
		_, err = NewGateway(cfg, slog.New(slog.DiscardHandler))
		assert.ErrorContains(t, err, tc.err, tc.name)
	}
}

func TestExampleConfigParses(t *testing.T) {
	b, err := os.ReadFile("gateway.yaml")
	require.NoError(t, err)
	cfg, err := ParseConfig(b)
	require.NoError(t, err)
	_, err = NewGateway(cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err, "the README's configuration builds")
}

// TestShutdownDelay: after the signal, for shutdownDelay, the gateway says
// it is not ready but still serves, closing each connection after its
// answer, so that the load balancer that has not yet taken it out of
// rotation gets answers, not refused connections; then it stops.
func TestShutdownDelay(t *testing.T) {
	a := newPod(t, nil)
	url, stop := startGateway(t, gatewayYAML(a.addr())+"shutdownDelay: 3s\n")
	require.Eventually(t, func() bool { return answersOK(url + "/readyz") }, 10*time.Second, 5*time.Millisecond)
	stopped := make(chan error, 1)
	begun := time.Now()
	go func() { stopped <- stop() }()

	require.Eventually(t, func() bool {
		r, err := http.Get(url + "/readyz")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(r.Body)
		_ = r.Body.Close()
		return r.StatusCode == 503 && string(b) == "shutting down\n"
	}, 3*time.Second, time.Millisecond, "not ready once shutdown begins")
	assert.True(t, answersOK(url+"/livez"), "alive")
	r, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err, "a new connection is still served")
	_, _ = io.Copy(io.Discard, r.Body)
	_ = r.Body.Close()
	assert.Equal(t, 200, r.StatusCode)
	assert.True(t, r.Close, "with keep-alive off: the client reconnects, through the balancer")
	require.NoError(t, <-stopped)
	assert.GreaterOrEqual(t, time.Since(begun), 3*time.Second, "it served on for the delay")
}
