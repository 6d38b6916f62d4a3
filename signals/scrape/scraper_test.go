package scrape

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/inferroute/inferroute/signals"
)

// fakeClock is a manual clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// pageServer serves whatever page (and status) was set last.
type pageServer struct {
	*httptest.Server
	page   atomic.Pointer[string]
	status atomic.Int32
	hits   atomic.Int64
	before func() // called at the start of each request, if set
}

func newPageServer(t *testing.T, page string) *pageServer {
	t.Helper()
	ps := &pageServer{}
	ps.page.Store(&page)
	ps.status.Store(http.StatusOK)
	ps.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ps.hits.Add(1)
		if ps.before != nil {
			ps.before()
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.WriteHeader(int(ps.status.Load()))
		_, _ = w.Write([]byte(*ps.page.Load()))
	}))
	t.Cleanup(ps.Close)
	return ps
}

func (ps *pageServer) set(page string) { ps.page.Store(&page) }

func (ps *pageServer) addr() string { return ps.Listener.Addr().String() }

func newTestScraper(t *testing.T, cfg Config, opts ...Option) *Scraper {
	t.Helper()
	s, err := New(cfg, opts...)
	require.NoError(t, err)
	t.Cleanup(s.Stop)
	return s
}

// TestScrapeSequence serves the three captures of llm-d-inference-sim in the
// order they were taken, then a page whose counters went down.
func TestScrapeSequence(t *testing.T) {
	clock := newFakeClock()
	srv := newPageServer(t, string(readFixture(t, "llm-d-inference-sim-under-load-a.prom")))
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "sim", Address: srv.addr()})
	s := newTestScraper(t, Config{}, WithClock(clock))
	s.SetEndpoints([]*signals.Endpoint{ep})

	// Work dispatched before the scrape is in the baseline.
	ep.Dispatch(100)
	sent := clock.Now()
	require.NoError(t, s.Scrape(context.Background(), ep))
	m := ep.Metrics()
	require.NotNil(t, m)
	assert.Equal(t, sent, m.ScrapedAt)
	assert.Equal(t, signals.Counters{Dispatched: 1, DispatchedTokens: 100}, m.Baseline)
	assert.Equal(t, known(2), m.Running)
	assert.Equal(t, known(3), m.Waiting)
	assert.Equal(t, known(0.0009765625), m.KVCacheUtilization)
	assert.Equal(t, unknown, m.PrefixCacheHitRate, "one scrape gives no rate")
	assert.True(t, m.LoRAKnown)
	assert.Equal(t, []string{"sql-lora"}, m.RunningAdapters)
	assert.Equal(t, []string{"chat-lora", "sql-lora"}, m.WaitingAdapters)
	assert.Equal(t, 1, m.MaxLoRA)
	assert.Equal(t, 16, m.BlockSize)
	assert.Equal(t, 1024, m.NumBlocks)
	gen := ep.Generation()

	steps := []struct {
		name    string
		page    string
		rate    signals.Reading
		restart bool
	}{
		// queries 30 -> 43, hits 0 -> 0.
		{"under-load-b", string(readFixture(t, "llm-d-inference-sim-under-load-b.prom")), known(0), false},
		// queries 43 -> 147, hits 0 -> 32.
		{"after-load", string(readFixture(t, "llm-d-inference-sim-after-load.prom")), known(32.0 / 104.0), false},
		// No query since: the rate is unknown, not zero.
		{"after-load again", string(readFixture(t, "llm-d-inference-sim-after-load.prom")), unknown, false},
		// Counters went down: a restart; counted from zero.
		{"restart", "vllm:prefix_cache_hits_total 5\nvllm:prefix_cache_queries_total 20\n", known(0.25), true},
		// No counters at all: unknown, and the next page starts over.
		{"idle", string(readFixture(t, "llm-d-inference-sim-idle.prom")), unknown, false},
		{"first counters again", "vllm:prefix_cache_hits_total 1\nvllm:prefix_cache_queries_total 2\n", unknown, false},
		{"hits outrun queries", "vllm:prefix_cache_hits_total 11\nvllm:prefix_cache_queries_total 7\n", known(1), false},
	}
	for _, st := range steps {
		clock.Advance(50 * time.Millisecond)
		srv.set(st.page)
		require.NoError(t, s.Scrape(context.Background(), ep), st.name)
		assert.Equal(t, st.rate, ep.Metrics().PrefixCacheHitRate, st.name)
		if st.restart {
			gen++
		}
		assert.Equal(t, gen, ep.Generation(), st.name)
	}
}

func TestScrapeAdaptersSharedWhenUnchanged(t *testing.T) {
	srv := newPageServer(t, string(readFixture(t, "llm-d-inference-sim-under-load-a.prom")))
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "sim", Address: srv.addr()})
	s := newTestScraper(t, Config{}, WithClock(newFakeClock()))
	s.SetEndpoints([]*signals.Endpoint{ep})
	require.NoError(t, s.Scrape(context.Background(), ep))
	first := ep.Metrics()
	require.NoError(t, s.Scrape(context.Background(), ep))
	second := ep.Metrics()
	require.NotSame(t, first, second)
	require.Len(t, second.WaitingAdapters, 2)
	assert.Same(t, &first.WaitingAdapters[0], &second.WaitingAdapters[0])
}

// TestScrapeFailureAndRecovery: three failures mark the endpoint down, the
// last snapshot stays and ages, the first good scrape brings it back.
func TestScrapeFailureAndRecovery(t *testing.T) {
	clock := newFakeClock()
	srv := newPageServer(t, "tgi_queue_size 4\ntgi_batch_current_size 2\n")
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "tgi", Address: srv.addr(), Engine: "tgi"})
	s := newTestScraper(t, Config{}, WithClock(clock))
	s.SetEndpoints([]*signals.Endpoint{ep})

	require.NoError(t, s.Scrape(context.Background(), ep))
	good := ep.Metrics()
	require.NotNil(t, good)
	assert.Equal(t, known(4), good.Waiting)
	assert.Equal(t, known(2), good.Running)
	assert.Equal(t, unknown, good.KVCacheUtilization, "TGI has no KV utilisation")

	srv.status.Store(http.StatusInternalServerError)
	for i := 1; i <= 3; i++ {
		clock.Advance(100 * time.Millisecond)
		err := s.Scrape(context.Background(), ep)
		var se *Error
		require.ErrorAs(t, err, &se)
		assert.Equal(t, ReasonStatus, se.Reason)
		assert.Equal(t, http.StatusInternalServerError, se.StatusCode)
		assert.ErrorIs(t, err, ErrBadStatus)
		assert.Equal(t, i < 3, ep.Healthy(), "after %d failures", i)
		st, ok := s.Status(ep)
		require.True(t, ok)
		assert.Equal(t, i, st.ConsecutiveFailures)
		assert.Same(t, good, ep.Metrics(), "a failed scrape keeps the last snapshot")
	}
	// The kept snapshot is 300 ms old: with a 100 ms half-life its
	// confidence is 2^-3.
	assert.InDelta(t, 0.125, signals.Confidence(ep.Metrics().ScrapedAt, clock.Now(), 100*time.Millisecond), 1e-12)

	srv.status.Store(http.StatusOK)
	srv.set("tgi_queue_size 0\ntgi_batch_current_size 1\n")
	clock.Advance(100 * time.Millisecond)
	require.NoError(t, s.Scrape(context.Background(), ep))
	assert.True(t, ep.Healthy())
	assert.Equal(t, known(0), ep.Metrics().Waiting)
	st, _ := s.Status(ep)
	assert.Equal(t, 0, st.ConsecutiveFailures)
	assert.Equal(t, uint64(5), st.Scrapes)
	assert.Equal(t, uint64(3), st.Failures)
	assert.Equal(t, clock.Now(), st.LastSuccess)
	assert.NoError(t, st.LastError)
}

// TestScrapeSentBeforeConnectError: a scrape answered while the router
// sees its first connect error to the endpoint (a pod dying as it answers)
// succeeds, publishes its snapshot, but does not bring the endpoint back:
// it was sent before the failure. The next scrape does.
func TestScrapeSentBeforeConnectError(t *testing.T) {
	srv := newPageServer(t, "tgi_queue_size 4\ntgi_batch_current_size 2\n")
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	srv.before = func() {
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-release
		}
	}
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "tgi", Address: srv.addr(), Engine: "tgi"})
	s := newTestScraper(t, Config{})
	s.SetEndpoints([]*signals.Endpoint{ep})

	done := make(chan error, 1)
	go func() { done <- s.Scrape(context.Background(), ep) }()
	<-entered
	ep.ReportConnectError()
	close(release)
	require.NoError(t, <-done)
	require.NotNil(t, ep.Metrics(), "the snapshot is still published")
	assert.False(t, ep.Healthy(), "a scrape sent before the connect error does not undo it")

	require.NoError(t, s.Scrape(context.Background(), ep))
	assert.True(t, ep.Healthy(), "a scrape sent after it does")
}

// TestScrapeBadInput: every kind of bad page gives a per-endpoint error with
// a reason, never a panic or a hang.
func TestScrapeBadInput(t *testing.T) {
	partial := readFixture(t, "vllm-v0-aibrix-docs-partial.prom")
	fifty := strings.Repeat("# padding padding padding padding padding padding\n", 1<<20/50)
	cases := []struct {
		name    string
		handler http.HandlerFunc
		reason  string
		cause   error
	}{
		{"html error page", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("<html><body>oops</body></html>\n"))
		}, ReasonContentType, ErrContentType},
		{"html served as text", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte("<!DOCTYPE html>\n<html></html>\n"))
		}, ReasonParse, nil},
		{"protobuf", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited")
			_, _ = w.Write([]byte{0x0a, 0x03})
		}, ReasonContentType, ErrContentType},
		{"garbage bytes", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte("\x00\xff\xfe garbage\n"))
		}, ReasonParse, nil},
		{"truncated page", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write(partial[:len(partial)-5])
		}, ReasonParse, nil},
		{"empty page", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
		}, ReasonParse, ErrEmptyPage},
		{"http 500", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
		}, ReasonStatus, ErrBadStatus},
		{"body cut short", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", "1000")
			_, _ = w.Write([]byte("tgi_queue_size 1\n"))
		}, ReasonRead, nil},
		{"slow response", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}, ReasonTimeout, context.DeadlineExceeded},
		{"50 MB streamed page", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			for i := 0; i < 50 && r.Context().Err() == nil; i++ {
				if _, err := w.Write([]byte(fifty)); err != nil {
					return
				}
			}
		}, ReasonTooLarge, ErrPageTooLarge},
		{"50 MB declared page", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", fmt.Sprint(50<<20))
			_, _ = w.Write([]byte("tgi_queue_size 1\n"))
		}, ReasonTooLarge, ErrPageTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(c.handler)
			defer srv.Close()
			ep := signals.NewEndpoint(signals.EndpointSpec{Name: "x", Address: srv.Listener.Addr().String()})
			timeout := 10 * time.Second
			if c.reason == ReasonTimeout {
				timeout = 100 * time.Millisecond
			}
			// The streamed page is cut at 256 KiB rather than the default
			// 4 MiB to keep the race-detector run short; the declared page
			// is refused by the default cap.
			var maxBytes int64
			if c.name == "50 MB streamed page" {
				maxBytes = 256 << 10
			}
			s := newTestScraper(t, Config{Timeout: timeout, MaxPageBytes: maxBytes}, WithClock(newFakeClock()))
			s.SetEndpoints([]*signals.Endpoint{ep})
			for i := 0; i < DefaultFailureThreshold; i++ {
				err := s.Scrape(context.Background(), ep)
				var se *Error
				require.ErrorAs(t, err, &se)
				assert.Equal(t, c.reason, se.Reason, "%v", err)
				assert.Equal(t, "x", se.Endpoint)
				if c.cause != nil {
					assert.ErrorIs(t, err, c.cause)
				}
			}
			assert.Nil(t, ep.Metrics())
			assert.False(t, ep.Healthy())
		})
	}
}

func TestScrapeUnreachableAndUnknown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	refused := signals.NewEndpoint(signals.EndpointSpec{Name: "refused", Address: addr})
	noEngine := signals.NewEndpoint(signals.EndpointSpec{Name: "odd", Address: addr, Engine: "llamacpp"})
	badURL := signals.NewEndpoint(signals.EndpointSpec{Name: "bad", MetricsURL: "http://[::1"})
	s := newTestScraper(t, Config{Timeout: 200 * time.Millisecond}, WithClock(newFakeClock()))
	s.SetEndpoints([]*signals.Endpoint{refused, noEngine, badURL})

	var se *Error
	require.ErrorAs(t, s.Scrape(context.Background(), refused), &se)
	assert.Equal(t, ReasonConnect, se.Reason)
	err = s.Scrape(context.Background(), noEngine)
	require.ErrorAs(t, err, &se)
	assert.Equal(t, ReasonEngine, se.Reason)
	assert.ErrorIs(t, err, ErrUnknownEngine)
	require.ErrorAs(t, s.Scrape(context.Background(), badURL), &se)
	assert.Equal(t, ReasonRequest, se.Reason)

	outsider := signals.NewEndpoint(signals.EndpointSpec{Name: "outsider", Address: addr})
	assert.ErrorIs(t, s.Scrape(context.Background(), outsider), ErrUnknownEndpoint)
	_, ok := s.Status(outsider)
	assert.False(t, ok)

	// A caller that gives up says nothing about the endpoint.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	healthyBefore := refused.Healthy()
	st0, _ := s.Status(refused)
	require.Error(t, s.Scrape(ctx, refused))
	st1, _ := s.Status(refused)
	assert.Equal(t, st0, st1)
	assert.Equal(t, healthyBefore, refused.Healthy())
}

// TestUserDefinedEngine decodes a metric map from YAML and from JSON, as a
// configuration file would hold it, and scrapes a server that speaks it.
func TestUserDefinedEngine(t *testing.T) {
	const y = `
running:
  - metric: myserver_active
    labels: {pool: gpu}
    aggregation: sum
waiting:
  - metric: myserver_pending
kv_cache_utilization:
  - metric: myserver_kv_ratio
    aggregation: max
prefix_cache_counters:
  - hits: {metric: myserver_prefix_hits}
    queries: {metric: myserver_prefix_lookups}
lora:
  metric: myserver_adapters
  running_label: active
  waiting_label: queued
  max_label: slots
`
	var fromYAML MetricMap
	require.NoError(t, yaml.Unmarshal([]byte(y), &fromYAML))
	js, err := json.Marshal(&fromYAML)
	require.NoError(t, err)
	var fromJSON MetricMap
	require.NoError(t, json.Unmarshal(js, &fromJSON))
	require.Equal(t, fromYAML, fromJSON)

	page := `myserver_active{pool="gpu",shard="0"} 3
myserver_active{pool="gpu",shard="1"} 2
myserver_active{pool="cpu"} 40
myserver_pending 6
myserver_kv_ratio{shard="0"} 0.25
myserver_kv_ratio{shard="1"} 1.5
myserver_prefix_hits_total 10
myserver_prefix_lookups_total 40
myserver_adapters{active="a, b",queued="",slots="2"} 5
`
	srv := newPageServer(t, page)
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "mine", Address: srv.addr(), Engine: "MyServer"})
	s := newTestScraper(t, Config{Engines: map[string]*MetricMap{"myserver": &fromJSON}}, WithClock(newFakeClock()))
	s.SetEndpoints([]*signals.Endpoint{ep})
	require.NoError(t, s.Scrape(context.Background(), ep))
	m := ep.Metrics()
	assert.Equal(t, known(5), m.Running)
	assert.Equal(t, known(6), m.Waiting)
	assert.Equal(t, known(1), m.KVCacheUtilization, "max 1.5 clamped to 1")
	assert.Equal(t, []string{"a", "b"}, m.RunningAdapters)
	assert.Empty(t, m.WaitingAdapters)
	assert.Equal(t, 2, m.MaxLoRA)

	_, err = New(Config{Engines: map[string]*MetricMap{"broken": {Running: []Selector{{}}}}})
	assert.Error(t, err)
}

func TestEngineSelection(t *testing.T) {
	srv := newPageServer(t, "tgi_queue_size 4\nvllm:num_requests_waiting 9\n")
	cases := []struct {
		name   string
		spec   signals.EndpointSpec
		label  string
		engine string // "" = unknown engine error
		want   signals.Reading
	}{
		{"default is vllm", signals.EndpointSpec{}, "", EngineVLLM, known(9)},
		{"spec field", signals.EndpointSpec{Engine: "TGI"}, "", EngineTGI, known(4)},
		{"label", signals.EndpointSpec{Labels: map[string]string{"engine": "tgi"}}, "", EngineTGI, known(4)},
		{"spec beats label", signals.EndpointSpec{Engine: "vllm", Labels: map[string]string{"engine": "tgi"}}, "", EngineVLLM, known(9)},
		{"custom label key", signals.EndpointSpec{Labels: map[string]string{"server": "tgi"}}, "server", EngineTGI, known(4)},
		{"label lookup disabled", signals.EndpointSpec{Labels: map[string]string{"engine": "tgi"}}, "-", EngineVLLM, known(9)},
		{"unknown", signals.EndpointSpec{Labels: map[string]string{"engine": "llamacpp"}}, "", "", unknown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := c.spec
			spec.Name, spec.Address = "e", srv.addr()
			ep := signals.NewEndpoint(spec)
			s := newTestScraper(t, Config{EngineLabel: c.label}, WithClock(newFakeClock()))
			s.SetEndpoints([]*signals.Endpoint{ep})
			err := s.Scrape(context.Background(), ep)
			if c.engine == "" {
				assert.ErrorIs(t, err, ErrUnknownEngine)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, ep.Metrics().Waiting)
		})
	}
}

func TestNegativeAndNonFiniteValues(t *testing.T) {
	srv := newPageServer(t, "vllm:num_requests_running -2\nvllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc -0.1\nvllm:gpu_prefix_cache_hit_rate -1\n")
	ep := signals.NewEndpoint(signals.EndpointSpec{Name: "v", Address: srv.addr()})
	s := newTestScraper(t, Config{}, WithClock(newFakeClock()))
	s.SetEndpoints([]*signals.Endpoint{ep})
	require.NoError(t, s.Scrape(context.Background(), ep))
	m := ep.Metrics()
	assert.Equal(t, unknown, m.Running)
	assert.Equal(t, unknown, m.Waiting)
	assert.Equal(t, unknown, m.KVCacheUtilization)
	assert.Equal(t, unknown, m.PrefixCacheHitRate, "-1 means prefix caching is off")
}

func TestNextScrape(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		failures int
		want     time.Duration
	}{
		{0, 50 * time.Millisecond},
		{1, 100 * time.Millisecond},
		{3, 400 * time.Millisecond},
		{6, 3200 * time.Millisecond},
		{7, 5 * time.Second}, // 6.4 s capped
		{100, 5 * time.Second},
	}
	s := newTestScraper(t, Config{Jitter: -1})
	for _, c := range cases {
		t.Run(fmt.Sprint(c.failures), func(t *testing.T) {
			assert.Equal(t, base.Add(c.want), s.nextScrape(base, c.failures))
		})
	}

	// With jitter 0.2, every delay lies within ±20% and they differ.
	j := newTestScraper(t, Config{Jitter: 0.2}, WithSeed(42))
	seen := map[time.Duration]bool{}
	for i := 0; i < 100; i++ {
		d := j.nextScrape(base, 0).Sub(base)
		require.GreaterOrEqual(t, d, 40*time.Millisecond)
		require.LessOrEqual(t, d, 60*time.Millisecond)
		seen[d] = true
	}
	assert.Greater(t, len(seen), 50)

	// The same seed gives the same sequence.
	a := newTestScraper(t, Config{}, WithSeed(7))
	b := newTestScraper(t, Config{}, WithSeed(7))
	for i := 0; i < 10; i++ {
		assert.Equal(t, a.nextScrape(base, 1), b.nextScrape(base, 1))
	}
}

// eventually polls cond every 5 ms for up to 10 s. It is a synchronisation
// helper, not a timing assertion.
func eventually(t *testing.T, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf(msg, args...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLoop runs the real scheduling loop against live servers: endpoints are
// scraped repeatedly, discovery adds and removes them while it runs, a
// failing endpoint is marked down and recovers, and no goroutine outlives
// Stop.
func TestLoop(t *testing.T) {
	baseline := runtime.NumGoroutine()
	func() {
		srvA := newPageServer(t, "vllm:num_requests_running 1\n")
		srvB := newPageServer(t, "vllm:num_requests_running 2\n")
		srvC := newPageServer(t, "vllm:num_requests_running 3\n")
		a := signals.NewEndpoint(signals.EndpointSpec{Name: "a", Address: srvA.addr()})
		b := signals.NewEndpoint(signals.EndpointSpec{Name: "b", Address: srvB.addr()})
		c := signals.NewEndpoint(signals.EndpointSpec{Name: "c", Address: srvC.addr()})

		s, err := New(Config{Interval: 2 * time.Millisecond, MaxBackoff: 10 * time.Millisecond, Concurrency: 2})
		require.NoError(t, err)
		s.SetEndpoints([]*signals.Endpoint{a, b})
		require.NoError(t, s.Start(context.Background()))
		assert.ErrorIs(t, s.Start(context.Background()), ErrStarted)

		scrapes := func(ep *signals.Endpoint) uint64 {
			st, _ := s.Status(ep)
			return st.Scrapes
		}
		eventually(t, func() bool { return scrapes(a) >= 3 && scrapes(b) >= 3 }, "a and b not scraped repeatedly")
		assert.Equal(t, known(1), a.Metrics().Running)
		assert.Equal(t, known(2), b.Metrics().Running)

		// Discovery: b leaves, c joins.
		s.SetEndpoints([]*signals.Endpoint{a, c})
		eventually(t, func() bool { return scrapes(c) >= 3 }, "c not scraped after it was added")
		assert.Equal(t, known(3), c.Metrics().Running)
		_, ok := s.Status(b)
		assert.False(t, ok)
		assert.ElementsMatch(t, []*signals.Endpoint{a, c}, s.Endpoints())
		hitsB := srvB.hits.Load()

		// a fails: marked down, then recovers.
		srvA.status.Store(http.StatusServiceUnavailable)
		eventually(t, func() bool { return !a.Healthy() }, "a not marked down")
		srvA.status.Store(http.StatusOK)
		eventually(t, func() bool { return a.Healthy() }, "a did not recover")

		s.Stop()
		s.Stop() // idempotent
		// b was removed long ago: at most the scrape in flight then reached it.
		assert.LessOrEqual(t, srvB.hits.Load(), hitsB+1)
		srvA.Close()
		srvB.Close()
		srvC.Close()
	}()
	eventually(t, func() bool { return runtime.NumGoroutine() <= baseline },
		"goroutines outlived Stop: %d > %d", runtime.NumGoroutine(), baseline)
}

func TestStopEndsOnContext(t *testing.T) {
	baseline := runtime.NumGoroutine()
	s, err := New(Config{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, s.Start(ctx))
	cancel()
	s.Stop()
	eventually(t, func() bool { return runtime.NumGoroutine() <= baseline }, "loop outlived its context")

	never, err := New(Config{})
	require.NoError(t, err)
	never.Stop()
	assert.ErrorIs(t, never.Start(context.Background()), ErrStarted, "a stopped scraper cannot start")
}

func TestErrorFormatting(t *testing.T) {
	e := &Error{Endpoint: "pod-1", Reason: ReasonParse, Err: &ParseError{Line: 3, Msg: "invalid value"}}
	assert.Equal(t, "scrape pod-1: parse: scrape: line 3: invalid value", e.Error())
	var pe *ParseError
	assert.True(t, errors.As(e, &pe))
}
