package router

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/internal/nettest"
	"github.com/inferroute/inferroute/picker"
	"github.com/inferroute/inferroute/scorer"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/signalstest"
)

const baseModel = "meta-llama/Llama-3.1-8B-Instruct"

// outcome is one Done seen by the recorder, with the request fields copied
// (the Request itself is pooled).
type outcome struct {
	ep      string
	model   string
	adapter string
	tokens  int
	out     signals.Outcome
}

// recorder is a signals.Observer that keeps every completion.
type recorder struct {
	mu   sync.Mutex
	outs []outcome
	ch   chan outcome
}

func newRecorder() *recorder { return &recorder{ch: make(chan outcome, 1024)} }

func (r *recorder) Dispatched(*signals.Request, *signals.Endpoint) {}

func (r *recorder) Completed(req *signals.Request, ep *signals.Endpoint, out signals.Outcome) {
	o := outcome{ep: ep.Name, model: req.Model, adapter: req.Adapter, tokens: req.PromptTokens, out: out}
	r.mu.Lock()
	r.outs = append(r.outs, o)
	r.mu.Unlock()
	r.ch <- o
}

// next waits for the next completion; it fails the test instead of hanging
// if none comes.
func (r *recorder) next(t *testing.T) outcome {
	t.Helper()
	select {
	case o := <-r.ch:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("no Done reported")
		return outcome{}
	}
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.outs)
}

// rankRegistry has a "rank" scorer that prefers endpoints with a higher
// "rank" label, so tests choose the primary and the order of fallbacks.
func rankRegistry(t testing.TB) *scorer.Registry {
	reg := scorer.NewRegistry()
	require.NoError(t, reg.RegisterScorer("rank", func(scorer.Params, scorer.Env) (scorer.Scorer, error) {
		return scorer.ScorerFunc(func(_ context.Context, in *scorer.Input, out []float64) {
			for i, ep := range in.Endpoints {
				r, _ := strconv.Atoi(ep.Labels["rank"])
				out[i] = float64(r) / 100
			}
		}), nil
	}))
	return reg
}

// env is a proxy in front of test backends.
type env struct {
	proxy *Proxy
	front *httptest.Server
	eps   []*signals.Endpoint
	rec   *recorder
	clock *signalstest.Clock
	pk    *picker.Picker
}

// newEnv builds a proxy whose pool "llama" has one endpoint per address,
// ranked in the order given (the first is picked first). Under
// TestProxyOverNetHTTPTransport a proxy without a Config.Transport gets
// NewTransport() instead of the built-in client.
func newEnv(t *testing.T, cfg Config, addrs ...string) *env {
	t.Helper()
	e := &env{rec: newRecorder(), clock: signalstest.NewClock(time.Unix(1_800_000_000, 0))}
	fallbacks := 2
	pk, err := picker.New(picker.Config{
		Filters: []picker.Plugin{{Name: "healthy"}},
		Scorers: []picker.Plugin{{Name: "rank", Weight: 1}}, Fallbacks: &fallbacks},
		picker.WithRegistry(rankRegistry(t)), picker.WithObservers(e.rec))
	require.NoError(t, err)
	for i, a := range addrs {
		e.eps = append(e.eps, signals.NewEndpoint(signals.EndpointSpec{
			Name: "ep" + strconv.Itoa(i), Address: a, Labels: map[string]string{"rank": strconv.Itoa(len(addrs) - i)},
		}))
	}
	pk.SetEndpoints(e.eps)
	e.pk = pk
	tab, err := NewTable(TableConfig{Pools: []PoolConfig{{
		Name: "llama", Picker: pk, Models: []string{baseModel},
		Adapters: map[string]string{"sql-lora": baseModel},
		Aliases:  map[string]string{"llama": baseModel},
	}}})
	require.NoError(t, err)
	if cfg.Clock == nil {
		cfg.Clock = e.clock
	}
	if cfg.Transport == nil && strings.HasPrefix(t.Name(), overTransport) {
		tr := NewTransport()
		t.Cleanup(tr.CloseIdleConnections)
		cfg.Transport = tr
		envsOverTransport.Add(1)
	}
	e.proxy, err = NewProxy(tab, cfg)
	require.NoError(t, err)
	e.front = httptest.NewServer(e.proxy)
	t.Cleanup(e.front.Close)
	return e
}

func (e *env) post(t *testing.T, path, body string, hdr http.Header) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.front.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := e.front.Client().Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

func (e *env) requireIdle(t *testing.T) {
	t.Helper()
	for _, ep := range e.eps {
		assert.Zero(t, ep.InFlight(), "in-flight on %s", ep.Name)
	}
}

// seen is what a backend received.
type seen struct {
	body   string
	header http.Header
	path   string
}

func backend(t *testing.T, h func(w http.ResponseWriter, r *http.Request)) (addr string, got chan seen) {
	t.Helper()
	got = make(chan seen, 256)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{body: string(b), header: r.Header.Clone(), path: r.URL.Path}
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), got
}

func jsonHandler(status int, body []byte, before func()) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		if before != nil {
			before()
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}
}

// sseEvents splits an SSE fixture into its events (each ending in "\n\n").
func sseEvents(b []byte) []string {
	var out []string
	for _, ev := range strings.SplitAfter(string(b), "\n\n") {
		if ev != "" {
			out = append(out, ev)
		}
	}
	return out
}

func sseHandler(events []string, before func(), between func(i int)) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		if before != nil {
			before()
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i, ev := range events {
			if between != nil {
				between(i)
			}
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}
}

// TestProxyStreamErrorEvent: the model server's own SSE error event (vLLM
// sends one, then [DONE], when generation fails after the headers) is
// relayed as it came and the request reported failed; when it is the
// first data event, without a TTFT, since no token came.
func TestProxyStreamErrorEvent(t *testing.T) {
	errEvent := `data: {"error": {"object": "error", "message": "engine failed", "type": "InternalServerError", "code": 500}}` + "\n\n"
	chunk := `data: {"id":"c1","object":"chat.completion.chunk","model":"` + baseModel + `","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}` + "\n\n"
	for _, tc := range []struct {
		name     string
		events   []string
		wantTTFT bool
	}{
		{"before any token", []string{errEvent, "data: [DONE]\n\n"}, false},
		{"after a token", []string{chunk, errEvent, "data: [DONE]\n\n"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e *env
			addr, _ := backend(t, sseHandler(tc.events, func() { e.clock.Advance(5 * time.Millisecond) }, nil))
			e = newEnv(t, Config{}, addr)
			r := e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
			require.Equal(t, 200, r.StatusCode)
			b, _ := io.ReadAll(r.Body)
			assert.Equal(t, strings.Join(tc.events, ""), string(b), "relayed as it came")
			o := e.rec.next(t)
			assert.ErrorIs(t, o.out.Err, ErrStreamErrorEvent)
			if tc.wantTTFT {
				assert.Equal(t, 5*time.Millisecond, o.out.TTFT, "a token came first")
			} else {
				assert.Zero(t, o.out.TTFT, "no token came")
			}
			e.requireIdle(t)
		})
	}
}

func TestProxyNonStreaming(t *testing.T) {
	resp := fixture(t, "openai-api/chat-completions.response.json")
	var clock *signalstest.Clock
	addr, got := backend(t, jsonHandler(200, resp, func() { clock.Advance(250 * time.Millisecond) }))
	e := newEnv(t, Config{}, addr)
	clock = e.clock
	body := string(fixture(t, "llm-d-inference-sim/chat-completions.request.json"))
	r := e.post(t, "/v1/chat/completions", body, nil)
	require.Equal(t, 200, r.StatusCode)
	b, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	assert.Equal(t, string(resp), string(b))
	assert.Equal(t, strconv.Itoa(len(resp)), r.Header.Get("Content-Length"))
	assert.Equal(t, body, (<-got).body, "the body is forwarded unchanged")
	o := e.rec.next(t)
	assert.Equal(t, "ep0", o.ep)
	assert.NoError(t, o.out.Err)
	assert.Equal(t, 250*time.Millisecond, o.out.TTFT, "TTFT is the injected clock's advance before the first byte")
	assert.Equal(t, 8, o.out.PromptTokens)
	assert.Equal(t, 377, o.out.CompletionTokens)
	assert.True(t, o.out.Buffered, "a JSON body comes whole: its TTFT includes the decode")
	e.requireIdle(t)
}

func TestProxyStreamingFlushesEachEvent(t *testing.T) {
	events := sseEvents(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.response.sse"))
	require.Len(t, events, 11)
	release := make(chan struct{})
	var e *env
	var prefillingBefore atomic.Int64
	addr, got := backend(t, sseHandler(events, func() {
		n, _ := e.eps[0].Prefilling()
		prefillingBefore.Store(n)
	}, func(i int) {
		if i == 1 {
			<-release // the second event waits until the client has the first
		}
	}))
	e = newEnv(t, Config{}, addr)
	r := e.post(t, "/v1/chat/completions", string(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.request.json")), nil)
	require.Equal(t, 200, r.StatusCode)
	assert.Equal(t, "text/event-stream", r.Header.Get("Content-Type"))
	br := bufio.NewReader(r.Body)
	first := readEvent(t, br)
	assert.Equal(t, events[0], first, "the first event arrives before the backend sends the second")
	assert.Equal(t, int64(1), prefillingBefore.Load(), "prefilling until the first response byte")
	n, _ := e.eps[0].Prefilling()
	assert.Zero(t, n, "the first response byte ends the prefill (picker.Result.FirstToken)")
	assert.Equal(t, int64(1), e.eps[0].InFlight(), "while the stream still decodes")
	close(release)
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Equal(t, strings.Join(events[1:], ""), string(rest))
	s := <-got
	assert.Contains(t, s.body, `"model":"sql-lora"`)
	o := e.rec.next(t)
	assert.NoError(t, o.out.Err)
	assert.Equal(t, baseModel, o.model)
	assert.Equal(t, "sql-lora", o.adapter, "a LoRA adapter routes to its base pool with the adapter set")
	assert.Equal(t, 26, o.out.PromptTokens, "usage from the last chunk")
	assert.Equal(t, 7, o.out.CompletionTokens)
	assert.False(t, o.out.Buffered, "an SSE stream is not buffered")
	e.requireIdle(t)
}

func readEvent(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	var sb strings.Builder
	for {
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		sb.WriteString(line)
		if line == "\n" {
			return sb.String()
		}
	}
}

func TestProxyModelRewrite(t *testing.T) {
	events := sseEvents(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.response.sse"))
	var served []string
	for _, ev := range events {
		served = append(served, strings.ReplaceAll(ev, `"model":"sql-lora"`, `"model":"`+baseModel+`"`))
	}
	jsonResp := fixture(t, "llm-d-inference-sim/chat-completions.response.json")
	// The responses API's stream names the model inside each event's
	// "response" object.
	var servedResponses []string
	for _, ev := range sseEvents(fixture(t, "llm-d-inference-sim/responses-stream.response.sse")) {
		servedResponses = append(servedResponses, strings.ReplaceAll(ev, `"model":"sql-lora"`, `"model":"`+baseModel+`"`))
	}
	require.Equal(t, 3, strings.Count(strings.Join(servedResponses, ""), `"model":"`+baseModel+`"`))
	tests := []struct {
		name   string
		path   string
		body   string
		h      func(http.ResponseWriter, *http.Request)
		stream bool
		models int // "model" fields in a stream
	}{
		{"json", "/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`, jsonHandler(200, jsonResp, nil), false, 0},
		{"sse", "/v1/chat/completions", `{"model":"llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`, sseHandler(served, nil, nil), true, 10},
		{"responses sse", "/v1/responses", `{"model":"llama","stream":true,"input":"hi"}`, sseHandler(servedResponses, nil, nil), true, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr, got := backend(t, tc.h)
			e := newEnv(t, Config{}, addr)
			r := e.post(t, tc.path, tc.body, nil)
			require.Equal(t, 200, r.StatusCode)
			b, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			assert.Contains(t, (<-got).body, `"model":"`+baseModel+`"`, "the upstream sees the served name")
			assert.NotContains(t, string(b), baseModel, "the client never sees the served name")
			if tc.stream {
				assert.Equal(t, tc.models, strings.Count(string(b), `"model":"llama"`), "every chunk is rewritten")
				if tc.path != "/v1/responses" { // whose stream has no [DONE]
					assert.True(t, strings.HasSuffix(string(b), "data: [DONE]\n\n"))
				}
			} else {
				var v struct{ Model string }
				require.NoError(t, json.Unmarshal(b, &v))
				assert.Equal(t, "llama", v.Model)
				assert.Equal(t, strconv.Itoa(len(b)), r.Header.Get("Content-Length"))
			}
			o := e.rec.next(t)
			assert.Equal(t, baseModel, o.model)
			assert.NoError(t, o.out.Err)
		})
	}
}

func TestProxyRetries(t *testing.T) {
	ok := fixture(t, "openai-api/chat-completions.response.json")
	failing := func(status int) func(http.ResponseWriter, *http.Request) {
		return jsonHandler(status, []byte(`{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`), nil)
	}
	body := `{"model":"` + baseModel + `","messages":[{"role":"user","content":"hi"}]}`
	t.Run("connect error then success", func(t *testing.T) {
		good, got := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{}, nettest.RefusedAddr(t), good)
		r := e.post(t, "/v1/chat/completions", body, nil)
		require.Equal(t, 200, r.StatusCode)
		<-got
		o := e.rec.next(t)
		assert.Equal(t, "ep0", o.ep, "the pick's Done reports the failed primary")
		assert.True(t, o.out.ConnectError)
		assert.Error(t, o.out.Err)
		o = e.rec.next(t)
		assert.Equal(t, "ep1", o.ep, "the retry's Done reports the fallback that served")
		assert.NoError(t, o.out.Err)
		assert.False(t, e.eps[0].Healthy(), "a refused connection marks the endpoint down")
		assert.True(t, e.eps[1].Healthy())
		e.requireIdle(t)
		assert.Equal(t, 2, e.rec.count(), "exactly one Done per attempt")
	})
	// A 5xx, or a 429 with which an overloaded server (TGI past
	// --max-concurrent-requests) turns a request away unserved, is retried
	// on a fallback; the endpoint stays in rotation.
	for _, status := range []int{503, 429} {
		t.Run(strconv.Itoa(status)+" then success", func(t *testing.T) {
			bad, _ := backend(t, failing(status))
			good, got := backend(t, jsonHandler(200, ok, nil))
			e := newEnv(t, Config{}, bad, good)
			r := e.post(t, "/v1/chat/completions", body, nil)
			require.Equal(t, 200, r.StatusCode)
			b, _ := io.ReadAll(r.Body)
			assert.Equal(t, string(ok), string(b))
			<-got
			o := e.rec.next(t)
			assert.Equal(t, "ep0", o.ep)
			assert.ErrorIs(t, o.out.Err, ErrUpstreamStatus)
			assert.False(t, o.out.ConnectError)
			o = e.rec.next(t)
			assert.Equal(t, "ep1", o.ep)
			assert.NoError(t, o.out.Err)
			assert.True(t, e.eps[0].Healthy(), "an error status is not a connect error")
			e.requireIdle(t)
			assert.Equal(t, 2, e.rec.count(), "exactly one Done per attempt")
		})
	}
	t.Run("a pod answering 5xx to everything is taken out of rotation", func(t *testing.T) {
		// A pod whose engine died behind a live HTTP server answers 500 at
		// once and holds no requests: to a least-loaded picker it looks
		// the best, and without ejection it would take a share of every
		// request and send each on to a fallback. After
		// signals.ProtocolErrorThreshold such answers in a row it is
		// marked down; a successful scrape gives it one request, and the
		// next 5xx marks it down again at once.
		dead, gotDead := backend(t, failing(500))
		good, gotGood := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{}, dead, good)
		const n = 20
		for range n {
			r := e.post(t, "/v1/chat/completions", body, nil)
			require.Equal(t, 200, r.StatusCode)
			_, _ = io.Copy(io.Discard, r.Body)
			e.rec.next(t)
		}
		assert.Len(t, gotDead, signals.ProtocolErrorThreshold, "the dead pod took requests until marked down")
		assert.Len(t, gotGood, n)
		assert.False(t, e.eps[0].Healthy())
		e.eps[0].ReportScrape(e.eps[0].HealthMark(), nil, 3) // its /metrics still answers
		require.True(t, e.eps[0].Healthy())
		for range n {
			r := e.post(t, "/v1/chat/completions", body, nil)
			require.Equal(t, 200, r.StatusCode)
			_, _ = io.Copy(io.Discard, r.Body)
			e.rec.next(t)
		}
		assert.Len(t, gotDead, signals.ProtocolErrorThreshold+1, "one request per scrape that brings it back")
		assert.False(t, e.eps[0].Healthy())
		e.requireIdle(t)
	})
	t.Run("error answers are relayed and reported without a TTFT", func(t *testing.T) {
		// The first byte of an error body is no token's: reported as one,
		// a 400 for a prompt over the context length, or a 429 from the
		// last endpoint left, would teach the latency predictor that the
		// endpoint prefills long prompts in 2 ms.
		tooLong := fixture(t, "llm-d-inference-sim/error-400-context-length.response.json")
		for _, tc := range []struct {
			status     int
			body       []byte
			retryAfter string
		}{{400, tooLong, ""}, {429, []byte(`{"error":"Model is overloaded","error_type":"overloaded"}`), "3"}} {
			var e *env
			only, got := backend(t, func(w http.ResponseWriter, r *http.Request) {
				e.clock.Advance(2 * time.Millisecond)
				if tc.retryAfter != "" {
					w.Header().Set("Retry-After", tc.retryAfter)
				}
				jsonHandler(tc.status, tc.body, nil)(w, r)
			})
			e = newEnv(t, Config{}, only)
			r := e.post(t, "/v1/chat/completions", body, nil)
			require.Equal(t, tc.status, r.StatusCode, "the last answer is relayed as it came")
			b, _ := io.ReadAll(r.Body)
			assert.Equal(t, string(tc.body), string(b))
			assert.Equal(t, tc.retryAfter, r.Header.Get("Retry-After"))
			<-got
			o := e.rec.next(t)
			assert.ErrorIs(t, o.out.Err, ErrUpstreamStatus, "%d", tc.status)
			assert.Zero(t, o.out.TTFT, "%d: no first token", tc.status)
			assert.Equal(t, 2*time.Millisecond, o.out.Latency, "%d: the attempt's time is kept", tc.status)
			assert.True(t, e.eps[0].Healthy())
			e.requireIdle(t)
		}
	})
	t.Run("a 4xx other than 429 is not retried", func(t *testing.T) {
		tooLong := fixture(t, "llm-d-inference-sim/error-400-context-length.response.json")
		bad, _ := backend(t, jsonHandler(400, tooLong, nil))
		other, got := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{}, bad, other)
		r := e.post(t, "/v1/chat/completions", body, nil)
		require.Equal(t, 400, r.StatusCode, "the client's own error, whichever server answers it")
		assert.Empty(t, got, "no fallback tried")
		e.rec.next(t)
		e.requireIdle(t)
	})
	t.Run("a fallback that failed since the pick is skipped", func(t *testing.T) {
		var e *env
		// ep0 answers 503; while it does, ep1 fails another request's
		// connection and is marked down. The retry goes to ep2.
		bad, _ := backend(t, jsonHandler(503, []byte(`{}`), func() { e.eps[1].MarkDown() }))
		skipped, gotSkipped := backend(t, jsonHandler(200, ok, nil))
		good, gotGood := backend(t, jsonHandler(200, ok, nil))
		e = newEnv(t, Config{}, bad, skipped, good)
		r := e.post(t, "/v1/chat/completions", body, nil)
		require.Equal(t, 200, r.StatusCode)
		<-gotGood
		assert.Len(t, gotSkipped, 0, "no traffic to an endpoint marked down")
		e.requireIdle(t)
	})
	t.Run("when every ranked target is down the picker is asked again", func(t *testing.T) {
		// ep0 is the pick, ep1 and ep2 its fallbacks: all dead. ep3, healthy
		// and ranked last, was not among them.
		good, got := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{}, nettest.RefusedAddr(t), nettest.RefusedAddr(t), nettest.RefusedAddr(t), good)
		r := e.post(t, "/v1/chat/completions", body, nil)
		require.Equal(t, 200, r.StatusCode)
		<-got
		for _, ep := range e.eps[:3] {
			assert.False(t, ep.Healthy(), ep.Name)
		}
		e.requireIdle(t)
	})
	t.Run("retries are bounded", func(t *testing.T) {
		var addrs []string
		var gots []chan seen
		for range 4 {
			a, g := backend(t, failing(500))
			addrs, gots = append(addrs, a), append(gots, g)
		}
		e := newEnv(t, Config{MaxRetries: 1}, addrs...)
		r := e.post(t, "/v1/chat/completions", body, nil)
		assert.Equal(t, 500, r.StatusCode, "the last attempt's 5xx reaches the client")
		b, _ := io.ReadAll(r.Body)
		assert.Contains(t, string(b), "boom")
		assert.Len(t, gots[0], 1)
		assert.Len(t, gots[1], 1)
		assert.Len(t, gots[2], 0, "MaxRetries 1: two attempts in all")
		assert.Len(t, gots[3], 0)
		e.requireIdle(t)
	})
	t.Run("negative MaxRetries: one attempt, no second pick", func(t *testing.T) {
		good, got := backend(t, jsonHandler(200, ok, nil))
		e := newEnv(t, Config{MaxRetries: -1}, nettest.RefusedAddr(t), good)
		r := e.post(t, "/v1/chat/completions", body, nil)
		requireAPIError(t, r, 502, "upstream_unreachable")
		assert.Empty(t, got, "neither the fallback nor a second pick was tried")
		o := e.rec.next(t)
		assert.Equal(t, "ep0", o.ep)
		assert.True(t, o.out.ConnectError)
		assert.Equal(t, 1, e.rec.count(), "one pick, one Done")
		e.requireIdle(t)
	})
	t.Run("every endpoint down before the request and unreachable: 503", func(t *testing.T) {
		dead := []string{nettest.RefusedAddr(t), nettest.RefusedAddr(t)}
		e := newEnv(t, Config{}, dead...)
		for _, ep := range e.eps {
			ep.MarkDown()
		}
		r := e.post(t, "/v1/chat/completions", body, nil)
		ae := requireAPIError(t, r, 503, "no_endpoint_available")
		for _, a := range dead {
			assert.NotContains(t, ae["message"], a, "the client is not told the fleet's addresses")
		}
		e.requireIdle(t)
	})
	t.Run("every endpoint unreachable", func(t *testing.T) {
		dead := []string{nettest.RefusedAddr(t), nettest.RefusedAddr(t), nettest.RefusedAddr(t)}
		e := newEnv(t, Config{}, dead...)
		r := e.post(t, "/v1/chat/completions", body, nil)
		ae := requireAPIError(t, r, 502, "upstream_unreachable")
		assert.Equal(t, "no model server could be reached", ae["message"])
		for _, a := range dead {
			assert.NotContains(t, ae["message"], a, "the client is not told the fleet's addresses")
		}
		e.requireIdle(t)
		for _, ep := range e.eps {
			assert.False(t, ep.Healthy(), ep.Name)
		}
	})
}

func requireAPIError(t *testing.T, r *http.Response, status int, code string) map[string]any {
	t.Helper()
	require.Equal(t, status, r.StatusCode)
	assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
	var v struct {
		Error map[string]any `json:"error"`
	}
	require.NoError(t, json.NewDecoder(r.Body).Decode(&v))
	for _, k := range []string{"message", "type", "param", "code"} {
		assert.Contains(t, v.Error, k, "OpenAI's error shape has %q", k)
	}
	assert.Equal(t, code, v.Error["code"])
	return v.Error
}

func TestProxyMidStreamFailure(t *testing.T) {
	events := sseEvents(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.response.sse"))
	tests := []struct {
		name string
		h    func(http.ResponseWriter, *http.Request)
	}{
		{"connection dropped", func(w http.ResponseWriter, r *http.Request) {
			sseHandler(events[:3], nil, nil)(w, r)
			panic(http.ErrAbortHandler) // closes the connection without ending the chunked body
		}},
		{"clean end without [DONE]", sseHandler(events[:3], nil, nil)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := backend(t, tc.h)
			e := newEnv(t, Config{}, addr)
			r := e.post(t, "/v1/chat/completions", `{"model":"sql-lora","stream":true}`, nil)
			require.Equal(t, 200, r.StatusCode)
			b, err := io.ReadAll(r.Body)
			require.NoError(t, err, "the client gets a well-formed end of stream")
			got := string(b)
			assert.True(t, strings.HasPrefix(got, strings.Join(events[:3], "")))
			last := sseEvents([]byte(got))
			require.Len(t, last, 4)
			payload, ok := sseData([]byte(strings.TrimSpace(last[3])))
			require.True(t, ok)
			var v struct {
				Error struct{ Message, Type, Code string }
			}
			require.NoError(t, json.Unmarshal(payload, &v))
			assert.Equal(t, "upstream_stream_error", v.Error.Code)
			assert.Equal(t, "server_error", v.Error.Type)
			o := e.rec.next(t)
			assert.ErrorIs(t, o.out.Err, ErrStreamBroken)
			e.requireIdle(t)
		})
	}
}

func TestProxyClientDisconnect(t *testing.T) {
	events := sseEvents(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.response.sse"))
	upstreamGone := make(chan struct{})
	addr, _ := backend(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, events[0])
		w.(http.Flusher).Flush()
		<-r.Context().Done() // only the proxy cancelling ends this
		close(upstreamGone)
	})
	e := newEnv(t, Config{}, addr)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.front.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"sql-lora","stream":true}`))
	require.NoError(t, err)
	resp, err := e.front.Client().Do(req)
	require.NoError(t, err)
	assert.Equal(t, events[0], readEvent(t, bufio.NewReader(resp.Body)))
	cancel()
	_ = resp.Body.Close()
	select {
	case <-upstreamGone:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
	o := e.rec.next(t)
	assert.ErrorIs(t, o.out.Err, context.Canceled)
	e.requireIdle(t)
}

func TestProxyErrors(t *testing.T) {
	ok, _ := backend(t, jsonHandler(200, []byte(`{}`), nil))
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	slow, _ := backend(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	})
	reject := func(t *testing.T) *Proxy {
		reg := rankRegistry(t)
		pk, err := picker.New(picker.Config{}, picker.WithRegistry(reg), picker.WithAdmitter(denyAll{}))
		require.NoError(t, err)
		pk.SetEndpoints([]*signals.Endpoint{signals.NewEndpoint(signals.EndpointSpec{Address: ok})})
		tab, err := NewTable(TableConfig{Pools: []PoolConfig{{Name: "p", Picker: pk, Models: []string{"m"}}}})
		require.NoError(t, err)
		p, err := NewProxy(tab, Config{RetryAfter: 1500 * time.Millisecond})
		require.NoError(t, err)
		return p
	}
	empty := func(t *testing.T) *Proxy {
		tab, err := NewTable(TableConfig{Pools: []PoolConfig{{Name: "p", Picker: newTestPicker(t), Models: []string{"m"}}}})
		require.NoError(t, err)
		p, err := NewProxy(tab, Config{})
		require.NoError(t, err)
		return p
	}
	truncated := `{"model":"` + baseModel + `","messages":[`
	tests := []struct {
		name   string
		proxy  func(t *testing.T) *Proxy
		body   string
		status int
		code   string
		param  any
	}{
		{"malformed JSON", nil, truncated, 400, "invalid_request", nil},
		{"model of the wrong type", nil, `{"model":7}`, 400, "invalid_request", "model"},
		{"unknown model", nil, `{"model":"gpt-9"}`, 404, "model_not_found", "model"},
		{"body over the limit", func(t *testing.T) *Proxy { return newEnv(t, Config{MaxBodyBytes: 64}, ok).proxy },
			`{"model":"` + baseModel + `","prompt":"` + strings.Repeat("x", 100) + `"}`, 413, "request_too_large", nil},
		{"shed", reject, `{"model":"m"}`, 429, "rate_limit_exceeded", nil},
		{"no endpoints", empty, `{"model":"m"}`, 503, "no_endpoint_available", nil},
		{"upstream timeout", func(t *testing.T) *Proxy {
			return newEnv(t, Config{UpstreamTimeout: 20 * time.Millisecond}, slow).proxy
		},
			`{"model":"` + baseModel + `"}`, 504, "upstream_timeout", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Handler(newEnv(t, Config{}, ok).proxy)
			if tc.proxy != nil {
				h = tc.proxy(t)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			r, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(tc.body))
			require.NoError(t, err)
			defer r.Body.Close()
			e := requireAPIError(t, r, tc.status, tc.code)
			assert.Equal(t, tc.param, e["param"])
			if tc.body == truncated {
				// Reading stopped at the end of the body, between values;
				// the client is told where, not which package noticed.
				assert.Equal(t, fmt.Sprintf("malformed request: malformed JSON at byte %d", len(truncated)), e["message"])
			}
			if tc.status == 429 {
				assert.Equal(t, "2", r.Header.Get("Retry-After"), "1.5 s rounds up")
			}
		})
	}
}

type denyAll struct{}

func (denyAll) Admit(context.Context, *scorer.Input) (bool, string) { return false, "test" }

func TestProxyHeaderSpoofing(t *testing.T) {
	evil, evilGot := backend(t, jsonHandler(200, []byte(`{"evil":true}`), nil))
	good, got := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e := newEnv(t, Config{StripHeaders: []string{"x-gateway-destination-endpoint-subset"}, EndpointHeader: HeaderDestination}, good)
	r := e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`"}`, http.Header{
		"X-Gateway-Destination-Endpoint":        {evil},
		"X-Gateway-Destination-Endpoint-Subset": {evil},
		"Connection":                            {"X-Secret"},
		"X-Secret":                              {"hop"},
		"Proxy-Authorization":                   {"Basic Zm9vOmJhcg=="},
		"Te":                                    {"trailers"},
		"Authorization":                         {"Bearer sk-test"},
	})
	require.Equal(t, 200, r.StatusCode)
	s := <-got
	assert.Empty(t, evilGot, "the client cannot choose the upstream")
	assert.Equal(t, good, s.header.Get(HeaderDestination), "the header names the endpoint the picker chose")
	for _, h := range []string{"X-Gateway-Destination-Endpoint-Subset", "X-Secret", "Proxy-Authorization", "Te"} {
		assert.Empty(t, s.header.Get(h), h)
	}
	assert.Equal(t, "Bearer sk-test", s.header.Get("Authorization"), "end-to-end headers pass")
	assert.Equal(t, "127.0.0.1", s.header.Get("X-Forwarded-For"))
}

func TestProxyFallbackRoute(t *testing.T) {
	addr, got := backend(t, jsonHandler(200, []byte(`{"ok":true}`), nil))
	e := newEnv(t, Config{}, addr)
	t.Run("GET health check", func(t *testing.T) {
		r, err := e.front.Client().Get(e.front.URL + "/health")
		require.NoError(t, err)
		defer r.Body.Close()
		assert.Equal(t, 200, r.StatusCode)
		s := <-got
		assert.Equal(t, "/health", s.path)
		o := e.rec.next(t)
		assert.Equal(t, "", o.model)
	})
	t.Run("GET with a body naming a model", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodGet, e.front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-9"}`))
		require.NoError(t, err)
		r, err := e.front.Client().Do(req)
		require.NoError(t, err)
		defer r.Body.Close()
		assert.Equal(t, 200, r.StatusCode, "a GET takes the fallback route whatever its body says")
		<-got
		assert.Equal(t, "", e.rec.next(t).model)
	})
	t.Run("non-JSON body", func(t *testing.T) {
		r := e.post(t, "/tokenize", "plain text", nil)
		assert.Equal(t, 200, r.StatusCode)
		assert.Equal(t, "plain text", (<-got).body)
		e.rec.next(t)
	})
	t.Run("no model", func(t *testing.T) {
		r := e.post(t, "/v1/embeddings", `{"input":"x"}`, nil)
		assert.Equal(t, 200, r.StatusCode)
		<-got
		e.rec.next(t)
	})
	t.Run("models from the table", func(t *testing.T) {
		_, b := getBody(t, e.front.Client(), e.front.URL+"/v1/models")
		assert.JSONEq(t, `{"object":"list","data":[
			{"id":"`+baseModel+`","object":"model","created":0,"owned_by":"inferroute","root":"`+baseModel+`","parent":null},
			{"id":"sql-lora","object":"model","created":0,"owned_by":"inferroute","root":"sql-lora","parent":"`+baseModel+`"},
			{"id":"llama","object":"model","created":0,"owned_by":"inferroute","root":"`+baseModel+`","parent":null}]}`, b)
		assert.Empty(t, got, "not forwarded")
	})
	t.Run("one model from the table", func(t *testing.T) {
		get := func(path string) (int, string) { return getBody(t, e.front.Client(), e.front.URL+path) }
		// The alias, which no model server knows, and the served name,
		// whose slash may come escaped or not.
		code, body := get("/v1/models/llama")
		assert.Equal(t, 200, code)
		assert.JSONEq(t, `{"id":"llama","object":"model","created":0,"owned_by":"inferroute","root":"`+baseModel+`","parent":null}`, body)
		for _, path := range []string{"/v1/models/" + baseModel, "/v1/models/" + strings.ReplaceAll(baseModel, "/", "%2F")} {
			code, body = get(path)
			assert.Equal(t, 200, code, path)
			assert.JSONEq(t, `{"id":"`+baseModel+`","object":"model","created":0,"owned_by":"inferroute","root":"`+baseModel+`","parent":null}`, body, path)
		}
		code, body = get("/v1/models/sql-lora/")
		assert.Equal(t, 200, code)
		assert.JSONEq(t, `{"id":"sql-lora","object":"model","created":0,"owned_by":"inferroute","root":"sql-lora","parent":"`+baseModel+`"}`, body)
		code, body = get("/v1/models/gpt-9")
		assert.Equal(t, 404, code)
		assert.JSONEq(t, `{"error":{"message":"model not found: \"gpt-9\"","type":"invalid_request_error","param":"model","code":"model_not_found"}}`, body)
		assert.Empty(t, got, "none forwarded")
	})
	e.requireIdle(t)
}

// getBody GETs url with client and returns the status and the whole body.
func getBody(t *testing.T, client *http.Client, url string) (int, string) {
	t.Helper()
	r, err := client.Get(url)
	require.NoError(t, err)
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	return r.StatusCode, string(b)
}

func TestProxyConcurrentStreams(t *testing.T) {
	events := sseEvents(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.response.sse"))
	var addrs []string
	for range 3 {
		a, _ := backend(t, sseHandler(events, nil, nil))
		addrs = append(addrs, a)
	}
	e := newEnv(t, Config{}, addrs...)
	want := strings.Join(events, "")
	const n = 100
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"sql-lora","stream":true,"messages":[{"role":"user","content":"request %d"}]}`, i)
			r, err := e.front.Client().Post(e.front.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			defer r.Body.Close()
			b, err := io.ReadAll(r.Body)
			if err != nil {
				errs <- err
				return
			}
			if string(b) != want {
				errs <- errors.New("stream differs")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	for range n {
		o := e.rec.next(t)
		assert.NoError(t, o.out.Err)
		assert.Equal(t, 26, o.out.PromptTokens)
	}
	e.requireIdle(t)
}

// TestProxySetTable swaps the routing table under a stream in flight: the
// stream finishes on the pool it started with, and the next requests are
// routed, refused and listed by the new table.
func TestProxySetTable(t *testing.T) {
	events := sseEvents(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.response.sse"))
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	oldAddr, _ := backend(t, sseHandler(events, nil, func(i int) {
		if i == 1 {
			<-release
		}
	}))
	newAddr, gotNew := backend(t, jsonHandler(200, []byte(`{"id":"x","object":"chat.completion"}`), nil))
	e := newEnv(t, Config{}, oldAddr)
	defer unblock() // a failed test must not leave the old backend waiting

	r := e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`","stream":true}`, nil)
	require.Equal(t, 200, r.StatusCode)
	br := bufio.NewReader(r.Body)
	assert.Equal(t, events[0], readEvent(t, br))

	pk, err := picker.New(picker.Config{})
	require.NoError(t, err)
	pk.SetEndpoints([]*signals.Endpoint{signals.NewEndpoint(signals.EndpointSpec{Name: "qwen-0", Address: newAddr})})
	tab, err := NewTable(TableConfig{Pools: []PoolConfig{{Name: "qwen", Picker: pk, Models: []string{"qwen"}}}})
	require.NoError(t, err)
	old := e.proxy.Table()
	e.proxy.SetTable(nil)
	assert.Same(t, old, e.proxy.Table(), "a nil table is ignored")
	e.proxy.SetTable(tab)
	assert.Same(t, tab, e.proxy.Table())

	unblock()
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Equal(t, strings.Join(events[1:], ""), string(rest), "the stream in flight finished on its pool")
	assert.NoError(t, e.rec.next(t).out.Err)
	e.requireIdle(t)

	requireAPIError(t, e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`"}`, nil), 404, "model_not_found")
	r = e.post(t, "/v1/chat/completions", `{"model":"qwen"}`, nil)
	require.Equal(t, 200, r.StatusCode)
	assert.Equal(t, `{"model":"qwen"}`, (<-gotNew).body)

	resp, err := e.front.Client().Get(e.front.URL + "/v1/models")
	require.NoError(t, err)
	defer resp.Body.Close()
	var models struct{ Data []struct{ ID string } }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&models))
	require.Len(t, models.Data, 1)
	assert.Equal(t, "qwen", models.Data[0].ID, "/v1/models lists the new table")
}

// TestProxyPoolHeader: a pool's PoolConfig.Header replaces the client's
// fields on the requests sent to it, and removes those it gives no value;
// the next request, routed by a table without it, sends the client's
// again.
func TestProxyPoolHeader(t *testing.T) {
	addr, got := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e := newEnv(t, Config{}, addr)
	plain := e.proxy.Table()
	withHeader, err := NewTable(TableConfig{Pools: []PoolConfig{{
		Name: "llama", Picker: e.pk, Models: []string{baseModel},
		Header: http.Header{"authorization": {"Bearer pool-key"}, "X-Api-Version": nil, "X-Tenant": {"gateway"}},
	}}})
	require.NoError(t, err)
	client := http.Header{"Authorization": {"Bearer client-key"}, "X-Api-Version": {"2"}, "X-Tenant": {"evil"}}

	e.proxy.SetTable(withHeader)
	for range 2 { // the second on a reused call and connection
		require.Equal(t, 200, e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`"}`, client).StatusCode)
		s := <-got
		assert.Equal(t, []string{"Bearer pool-key"}, s.header.Values("Authorization"), "the pool's credential, not the client's")
		assert.Empty(t, s.header.Values("X-Api-Version"), "a field with no value is removed")
		assert.Equal(t, []string{"gateway"}, s.header.Values("X-Tenant"))
		e.rec.next(t)
	}

	e.proxy.SetTable(plain)
	require.Equal(t, 200, e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`"}`, client).StatusCode)
	s := <-got
	assert.Equal(t, "Bearer client-key", s.header.Get("Authorization"), "the pool's header stays with its pool")
	assert.Equal(t, "2", s.header.Get("X-Api-Version"))
	e.rec.next(t)
	e.requireIdle(t)
}

// TestProxyLoop: a pool whose endpoint is the gateway itself gets the
// request back with the router's own Via, which is answered 508 at once
// rather than forwarded again until file descriptors run out; the Via the
// model servers get keeps the clients' and adds the router's.
func TestProxyLoop(t *testing.T) {
	addr, got := backend(t, jsonHandler(200, []byte(`{}`), nil))
	e := newEnv(t, Config{}, addr)
	require.Equal(t, 200, e.post(t, "/v1/chat/completions", `{"model":"`+baseModel+`"}`,
		http.Header{"Via": {"1.0 corp-proxy"}}).StatusCode)
	via := (<-got).header.Values("Via")
	require.Len(t, via, 2)
	assert.Equal(t, "1.0 corp-proxy", via[0])
	assert.Regexp(t, `^1\.1 inferroute-[0-9a-f]{8}$`, via[1])
	e.rec.next(t)

	pk, err := picker.New(picker.Config{})
	require.NoError(t, err)
	self := signals.NewEndpoint(signals.EndpointSpec{Name: "self", Address: e.front.Listener.Addr().String()})
	pk.SetEndpoints([]*signals.Endpoint{self})
	tab, err := NewTable(TableConfig{Pools: []PoolConfig{{Name: "loop", Picker: pk, Models: []string{"loop"}}}})
	require.NoError(t, err)
	e.proxy.SetTable(tab)
	ae := requireAPIError(t, e.post(t, "/v1/chat/completions", `{"model":"loop"}`, nil), http.StatusLoopDetected, "loop_detected")
	assert.Contains(t, ae["message"], "an endpoint of the pool leads back to the gateway")
	assert.Zero(t, self.InFlight(), "both hops done")
}
