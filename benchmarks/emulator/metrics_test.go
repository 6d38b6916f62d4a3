package emulator

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferroute/inferroute/benchmarks/engine"
	"github.com/inferroute/inferroute/signals"
	"github.com/inferroute/inferroute/signals/scrape"
)

func getMetrics(t *testing.T, p *Pod) []byte {
	t.Helper()
	resp, err := http.Get(p.URL() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, metricsContentType, resp.Header.Get("Content-Type"))
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return b
}

// TestMetricsPage parses the page with the library's full (expfmt) parser,
// which rejects anything that is not the text exposition format, and checks
// the names against vLLM's.
func TestMetricsPage(t *testing.T) {
	p := startPod(t, Options{Profile: "a100-llama3-8b", MaxLoRAs: 2, Adapters: []string{"sql-lora"}})
	page := getMetrics(t, p)
	for _, name := range []string{
		"vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
		"vllm:prefix_cache_hits_total{", "vllm:prefix_cache_queries_total{", "vllm:lora_requests_info{",
		"vllm:cache_config_info{", "vllm:time_to_first_token_seconds_bucket{", "vllm:time_to_first_token_seconds_count{",
		"vllm:time_to_first_token_seconds_sum{", "vllm:num_preemptions_total{", "vllm:request_success_total{",
	} {
		assert.Contains(t, string(page), name)
	}
	parser, err := scrape.NewParser(scrape.VLLMMap())
	require.NoError(t, err)
	full, err := parser.ParseFullBytes(page)
	require.NoError(t, err)
	fast, err := parser.Parse(page)
	require.NoError(t, err)
	assert.Equal(t, fast, full, "the fast parser and expfmt agree")

	prof, _ := engine.ProfileByName("a100-llama3-8b")
	assert.Equal(t, scrape.Page{
		Running:            signals.Known(0),
		Waiting:            signals.Known(0),
		KVCacheUtilization: signals.Known(0),
		PrefixCacheHits:    signals.Known(0),
		PrefixCacheQueries: signals.Known(0),
		LoRAKnown:          true,
		MaxLoRA:            2,
		BlockSize:          16,
		NumBlocks:          prof.NumBlocks(0.9, 16),
	}, full)
}

// TestScrapedSignals scrapes a pod with the library's Scraper while it
// serves requests and checks the signals the picker reads.
func TestScrapedSignals(t *testing.T) {
	// SlowDown keeps requests in the batch long enough to be seen running.
	p := startPod(t, Options{Profile: "l4-llama3-8b", MaxLoRAs: 1, Adapters: []string{"sql-lora", "chat-lora"}})
	ep := signals.NewEndpoint(p.Spec())
	s, err := scrape.New(scrape.Config{})
	require.NoError(t, err)
	s.SetEndpoints([]*signals.Endpoint{ep})
	ctx := context.Background()

	// Idle scrape: the baseline for the hit-rate counters.
	require.NoError(t, s.Scrape(ctx, ep))
	m := ep.Metrics()
	require.NotNil(t, m)
	assert.Equal(t, signals.Known(0), m.Running)
	assert.Equal(t, signals.Known(0), m.Waiting)
	assert.True(t, m.LoRAKnown)
	assert.Equal(t, 1, m.MaxLoRA)
	assert.Empty(t, m.RunningAdapters)
	assert.Equal(t, 16, m.BlockSize)
	prof, _ := engine.ProfileByName("l4-llama3-8b")
	assert.Equal(t, prof.NumBlocks(0.9, 16), m.NumBlocks)

	// The same 160-token prompt twice: 0 then 144 tokens hit.
	body := `{"model":"` + DefaultModel + `","prompt":"` + prompt640 + `","max_tokens":3}`
	for range 2 {
		r := post(t, p.URL()+"/v1/completions", body)
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	require.NoError(t, s.Scrape(ctx, ep))
	m = ep.Metrics()
	// Hit rate over the interval: 144 hits / 320 queried tokens.
	assert.Equal(t, signals.Known(144.0/320.0), m.PrefixCacheHitRate)
	assert.Equal(t, signals.Known(0), m.Running)

	// Hold one sql-lora and one chat-lora request in the engine: with one
	// adapter slot, sql-lora runs and chat-lora waits.
	p.SetFaults(Faults{SlowDown: 1000})
	var wg sync.WaitGroup
	for _, model := range []string{"sql-lora", "chat-lora"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := http.Post(p.URL()+"/v1/completions", "application/json",
				strings.NewReader(`{"model":"`+model+`","prompt":"hi","max_tokens":50}`))
			if err == nil {
				_, _ = io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
		}()
		require.Eventually(t, func() bool {
			st := p.Stats()
			return st.Running+st.Waiting == 1+btoi(model == "chat-lora")
		}, 10*time.Second, time.Millisecond)
	}
	require.Eventually(t, func() bool { return p.Stats().Running == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, s.Scrape(ctx, ep))
	m = ep.Metrics()
	assert.Equal(t, signals.Known(1), m.Running)
	assert.Equal(t, signals.Known(1), m.Waiting)
	assert.Equal(t, []string{"sql-lora"}, m.RunningAdapters)
	assert.Equal(t, []string{"chat-lora"}, m.WaitingAdapters)
	assert.Equal(t, signals.ResidencyRunning, ep.LoRAResidency("sql-lora", time.Now()))
	assert.Equal(t, signals.ResidencyWaiting, ep.LoRAResidency("chat-lora", time.Now()))
	kv, ok := ep.KVCacheUtilization(time.Now(), time.Second)
	require.True(t, ok)
	assert.Greater(t, kv, 0.0)

	// A restart resets the counters: the scraper sees it as a restart.
	gen := ep.Generation()
	p.Kill()
	wg.Wait()
	require.Error(t, s.Scrape(ctx, ep))
	require.NoError(t, p.Restart())
	p.SetFaults(Faults{})
	require.NoError(t, s.Scrape(ctx, ep))
	assert.Equal(t, signals.Known(0), ep.Metrics().Running)
	assert.Greater(t, ep.Generation(), gen)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestTTFTHistogram(t *testing.T) {
	var h histogram
	h.init([]float64{0.1, 1})
	for _, v := range []float64{0.05, 0.1, 0.5, 2} {
		h.observe(v)
	}
	assert.Equal(t, []uint64{2, 1}, h.counts)
	assert.Equal(t, uint64(4), h.count)
	assert.InDelta(t, 2.65, h.sum, 1e-12)
	h.reset()
	assert.Equal(t, []uint64{0, 0}, h.counts)
	assert.Zero(t, h.count)
}

func TestEscapeLabel(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain", "plain"},
		{`a"b`, `a\"b`},
		{"a\\b\nc", `a\\b\nc`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) { assert.Equal(t, tt.want, escapeLabel(tt.in)) })
	}
}
