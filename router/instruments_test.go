package router

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/inferroute/inferroute/internal/nettest"
	"github.com/inferroute/inferroute/signals/signalstest"
)

// TestProxyMetrics: the router's instruments count every request by pool,
// model and status, record every request's duration and every answered
// request's TTFT by whether it was streamed, in the injected clock's time,
// as an exporter collects them, twice in a row (the request counter is
// observed: the second collection must see the totals, not the
// increments).
func TestProxyMetrics(t *testing.T) {
	resp := fixture(t, "openai-api/chat-completions.response.json")
	events := sseEvents(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.response.sse"))
	var clock *signalstest.Clock
	advance := func() { clock.Advance(40 * time.Millisecond) }
	whole, stream := jsonHandler(200, resp, advance), sseHandler(events, advance, nil)
	addr, _ := backend(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-Stream") != "" {
			stream(w, r)
			return
		}
		whole(w, r)
	})
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEnv(t, Config{MeterProvider: mp}, addr)
	clock = e.clock
	body := string(fixture(t, "llm-d-inference-sim/chat-completions.request.json"))
	send := func(body string, want int, hdr http.Header) {
		r := e.post(t, "/v1/chat/completions", body, hdr)
		_, _ = io.Copy(io.Discard, r.Body)
		require.Equal(t, want, r.StatusCode)
	}
	for range 3 {
		send(body, 200, nil)
	}
	send(strings.Replace(body, baseModel, "no-such-model", 1), 404, nil)
	streamBody := string(fixture(t, "llm-d-inference-sim/chat-completions-lora-stream.request.json"))
	send(streamBody, 200, http.Header{"X-Test-Stream": {"1"}})

	type ttftKey struct{ model, stream string }
	collect := func() (requests map[string]int64, durations uint64, ttfts map[ttftKey]uint64, ttftSum float64) {
		ttfts = map[ttftKey]uint64{}
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		requests = map[string]int64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch m.Name {
				case "inferroute.router.requests":
					sum, ok := m.Data.(metricdata.Sum[int64])
					require.True(t, ok, "a sum: %T", m.Data)
					assert.True(t, sum.IsMonotonic)
					assert.Equal(t, metricdata.CumulativeTemporality, sum.Temporality)
					for _, dp := range sum.DataPoints {
						pool, _ := dp.Attributes.Value("pool")
						model, _ := dp.Attributes.Value("model")
						code, _ := dp.Attributes.Value("code")
						requests[pool.AsString()+"|"+model.AsString()+"|"+code.AsString()] += dp.Value
					}
				case "inferroute.router.request.duration":
					for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
						durations += dp.Count
					}
				case "inferroute.router.ttft":
					for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
						model, _ := dp.Attributes.Value("model")
						stream, _ := dp.Attributes.Value("stream")
						ttfts[ttftKey{model.AsString(), stream.AsString()}] += dp.Count
						ttftSum += dp.Sum
					}
				}
			}
		}
		return requests, durations, ttfts, ttftSum
	}
	want := map[string]int64{"llama|" + baseModel + "|200": 3, "||404": 1, "llama|sql-lora|200": 1}
	wantTTFT := map[ttftKey]uint64{{baseModel, "false"}: 3, {"sql-lora", "true"}: 1}
	for i := range 2 {
		requests, durations, ttfts, ttftSum := collect()
		assert.Equal(t, want, requests, "collection %d", i+1)
		assert.Equal(t, uint64(5), durations, "collection %d: every request's duration", i+1)
		assert.Equal(t, wantTTFT, ttfts, "collection %d: the TTFT of each answered request, JSON bodies as stream=false", i+1)
		assert.InDelta(t, 4*0.040, ttftSum, 1e-9, "collection %d: TTFT in the injected clock's seconds", i+1)
	}
	send(body, 200, nil)
	requests, _, _, _ := collect()
	assert.Equal(t, int64(4), requests["llama|"+baseModel+"|200"], "counts keep growing after a collection")
}

// TestProxyNotHeldByMeterProvider: the meter provider outlives a Proxy
// (one provider for a process, proxies rebuilt on configuration changes);
// its callback must not keep the dropped Proxy, with its table, pools and
// endpoints, alive.
func TestProxyNotHeldByMeterProvider(t *testing.T) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	collected := make(chan struct{})
	func() {
		e := newEnv(t, Config{}, nettest.RefusedAddr(t)) // only for its table
		p, err := NewProxy(e.proxy.Table(), Config{MeterProvider: mp})
		require.NoError(t, err)
		runtime.AddCleanup(p, func(ch chan struct{}) { close(ch) }, collected)
	}()
	requireCollected(t, collected)
	runtime.KeepAlive(mp)
}

// requireCollected runs the garbage collector until collected is closed,
// failing after 10 s.
func requireCollected(t *testing.T, collected chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		select {
		case <-collected:
			return
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("still reachable after 10 s of garbage collections")
		}
	}
}
